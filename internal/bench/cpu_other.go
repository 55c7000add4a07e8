//go:build !unix

package bench

import "time"

// processCPU is not measured where getrusage is missing: CPU per event
// reads zero.
func processCPU() time.Duration { return 0 }
