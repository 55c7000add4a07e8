//go:build unix

package workertest

import (
	"io"
	"os"
	"syscall"
)

// lockPort takes the lock on port p's byte of the lock file. It is not ok
// when another process holds it.
func lockPort(f *os.File, p int) bool {
	lock := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: io.SeekStart, Start: int64(p), Len: 1}
	return syscall.FcntlFlock(f.Fd(), syscall.F_SETLK, &lock) == nil
}
