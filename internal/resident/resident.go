// Package resident hands back to the operating system what a process's
// start-up left resident and its rest does not use, so that an idle
// worker holds what it works with and little more.
package resident

import "runtime/debug"

// Trim collects once and returns the freed heap to the operating system,
// then, where the system allows it, pages out the binary's own pages that
// only this process maps (see trimBinary). Call it once start-up is done:
// the packages' set-up and a first start's key sealing leave garbage an
// idle process would keep resident for minutes, since it allocates too
// little to reach the heap's goal, and code and tables that only init ran
// stay mapped until the system runs short.
//
// The error says only why the binary's pages stayed; the heap is returned
// whatever it says, and nothing else depends on it.
func Trim() error {
	debug.FreeOSMemory()
	return trimBinary()
}
