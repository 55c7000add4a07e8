package join_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/join"
	"github.com/steward-dev/steward/workers/workertest"
)

// hangingArmScript hangs on its first run, as a guard whose daemon never
// answers would: it starts a child that would outlive it, records both
// pids and waits. Later runs are the fixture's arm command.
const hangingArmScript = `#!/bin/sh
set -eu
here=$(dirname "$0")
if [ -e "$here/hang" ]; then
  sleep 600 &
  echo $! > "$here/hang.child"
  echo $$ > "$here/hang.pid"
  # Only a run that got this far counts: one killed earlier hangs again.
  rm -f "$here/hang"
  wait
fi
exec "$here/arm.sh" "$@"
`

// TestArmCommandTimeout runs an arm command that hangs: after --arm-timeout
// its whole process group is killed (the script and the child it started),
// the failure is retried with a message saying so, and the retry arms the
// box (the worker used to wait for the command for ever).
func TestArmCommandTimeout(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		workertest.Requires(t, "/proc, to see whether the killed processes are gone", err)
	}
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	f := newFixture(t, "box-h")
	f.write("hanging-arm.sh", hangingArmScript, 0o755)
	f.write("hang", "", 0o644)
	f.cfg.ArmCommand = f.path("hanging-arm.sh")
	f.cfg.ArmTimeout = 500 * time.Millisecond
	h, r := f.startRecording(js)
	f.publishFloor(js, f.floor("1.0.0"))
	// The floor and the invitation are different keys, handled side by
	// side: the floor is kept first, so the only failures are timeouts.
	waitOutcomes(t, js, "box-h", join.OutcomeFloorAccepted, 1)
	ack := f.publishInvitation(js, f.sign(f.invitation()))

	waitOutcomes(t, js, "box-h", join.OutcomeArmed, 1)
	workertest.WaitIdle(t, js, r.ConsumerName())
	assertNoDeadLetters(t, js, "box-h")
	// A loaded machine may kill a run before it reaches its hang, which
	// then hangs again: timeouts, then the success.
	errs := h.of(ack.ID)
	if len(errs) < 2 || errs[len(errs)-1] != nil {
		t.Fatalf("the invitation was handled with %v, want timeouts and then success", errs)
	}
	for _, err := range errs[:len(errs)-1] {
		if workers.IsPermanent(err) || workers.IsRefused(err) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("the timeout is %v, want a plain (retried) error wrapping context.DeadlineExceeded", err)
		}
		for _, want := range []string{"arm command " + f.cfg.ArmCommand, "box box-h", "enrollment enr-1", ack.ID,
			"did not finish within the --arm-timeout of 500ms, so its process group was killed", "retried with the files already written"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("timeout error %q does not say %q", err, want)
			}
		}
	}
	for _, name := range []string{"hang.pid", "hang.child"} {
		pid, err := strconv.Atoi(strings.TrimSpace(string(readFile(t, f.path(name)))))
		if err != nil {
			t.Fatal(err)
		}
		workertest.WaitUntil(t, name+" "+strconv.Itoa(pid)+" is gone", func() bool { return gone(pid) })
	}
	if n := f.armRuns(); n != 1 {
		t.Fatalf("the arm command completed %d times, want 1 (the retry)", n)
	}
}

// gone reports whether a process no longer runs: it does not exist, or it
// is a zombie waiting for a parent that is not the test to reap it.
func gone(pid int) bool {
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return true
	}
	// The state follows the parenthesised command name.
	_, after, ok := strings.Cut(string(raw), ") ")
	return ok && strings.HasPrefix(after, "Z")
}
