//go:build unix

package join

import (
	"os/exec"
	"syscall"
)

// killGroupOnCancel runs cmd as the leader of a process group of its own
// and makes cancelling it (the timeout, or shutdown) kill the whole group,
// so nothing the arm command started outlives it.
func killGroupOnCancel(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		// The negative pid names the group, whose id is the leader's pid.
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}
