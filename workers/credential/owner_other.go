//go:build !unix

package credential

import "io/fs"

// fileUID reports no owner where files have no owner uid (Windows): the
// ownership and mode checks are then skipped.
func fileUID(fs.FileInfo) (uid int, ok bool) { return 0, false }

// workerUID is -1: there is no uid to compare with.
func workerUID() int { return -1 }
