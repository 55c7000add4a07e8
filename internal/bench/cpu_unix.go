//go:build unix

package bench

import (
	"syscall"
	"time"
)

// processCPU is the CPU time the process has used so far, user and system:
// the server's, the publisher's and the consumer's, since the bench runs
// all of them in one process.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
