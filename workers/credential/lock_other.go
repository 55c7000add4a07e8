//go:build !unix

package credential

import "os"

// lockFile does nothing where flock does not exist; the runtime already
// handles one hive's events one at a time per process.
func lockFile(*os.File) (unlock func(), err error) { return func() {}, nil }
