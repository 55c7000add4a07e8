//go:build unix

package credential

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lockDir takes an exclusive flock on the credential directory itself, so
// two processes serving the same hive never interleave a read of the applied
// version with another's swap (which could let an older rotation win). It
// needs no lock file beside the credentials.
func lockDir(dir string) (unlock func(), err error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("the credential directory %s cannot be opened (%w); create or mount it and the rotation is retried", dir, errors.Unwrap(err))
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock the credential directory %s: %w", dir, err)
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
