//go:build unix

package credential

import (
	"os"
	"syscall"
)

// lockFile takes an exclusive flock on the credential folder itself, so two
// processes serving the same hive never interleave a read of the applied
// version with another's swap (which could let an older rotation win). It
// needs no lock file beside the credentials.
func lockFile(f *os.File) (unlock func(), err error) {
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return nil, err
	}
	return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }, nil
}
