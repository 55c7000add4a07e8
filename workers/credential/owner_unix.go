//go:build unix

package credential

import (
	"io/fs"
	"os"
	"syscall"
)

// fileUID is the owner of fi; ok is false where files have no owner uid.
func fileUID(fi fs.FileInfo) (uid int, ok bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}

// workerUID is the user the worker runs as, the one its files must belong to.
func workerUID() int { return os.Geteuid() }
