//go:build !linux

package resident

// trimBinary does nothing where the kernel offers no way to page out a
// process's own mapped file pages on request.
func trimBinary() error { return nil }
