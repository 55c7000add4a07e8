//go:build !unix

package join

import "os/exec"

// killGroupOnCancel leaves exec's default, which kills the arm command
// itself on cancel: process groups are a Unix notion, and boxes that run
// the guard are Unix hosts.
func killGroupOnCancel(cmd *exec.Cmd) {}
