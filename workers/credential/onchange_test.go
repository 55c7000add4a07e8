package credential_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/credential"
	"github.com/steward-dev/steward/workers/workertest"
)

// onChangeScript records every run of the --on-change command: a line per
// invocation with its arguments, its whole environment, and the client id
// in the folder it was told of (proving the pair was in place). Version 2
// fails; version 3 hangs with a child in its process group.
const onChangeScript = `#!/bin/sh
rec="$1"
v="$STEWARD_CREDENTIAL_VERSION"
echo "run $v args=$*" >> "$rec/invocations"
env > "$rec/env-$v"
cat "$STEWARD_CREDENTIAL_DATA/client_id" > "$rec/client-$v"
case "$v" in
2) exit 3 ;;
3) sleep 300 & echo $! > "$rec/child"; wait ;;
esac
`

// onChangeCounts reads OnChangeTotal for hive now and returns what each
// result has counted since. The counter is the process's, so a test run
// again in the same process (-count) starts from the last run's figures.
func onChangeCounts(hive string) func(result string) float64 {
	before := map[string]float64{}
	for _, r := range []string{credential.OnChangeSucceeded, credential.OnChangeFailed, credential.OnChangeTimedOut} {
		before[r] = testutil.ToFloat64(credential.OnChangeTotal.WithLabelValues(hive, r))
	}
	return func(result string) float64 {
		return testutil.ToFloat64(credential.OnChangeTotal.WithLabelValues(hive, result)) - before[result]
	}
}

// gone says whether the process pid has ended (absent, or a zombie no one
// has reaped yet).
func gone(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	_, rest, _ := strings.Cut(string(stat), ") ")
	return strings.HasPrefix(rest, "Z")
}

// TestOnChangeRunsOncePerAppliedVersion is issue 14's --on-change through
// the real runtime and a real shell script: it runs once per applied
// version with the version, hive and folders in its environment and no
// secret anywhere it can see; its failure and its timeout are reported in
// the applied outcome and counted, and never roll the pair back; a delivery
// that died after the swap and before the command gets the command run by
// its redelivery, and one that died after the command does not run it
// again.
func TestOnChangeRunsOncePerAppliedVersion(t *testing.T) {
	// A password in the worker's own environment must not reach the command.
	t.Setenv("STEWARD_NATS_URL", "nats://worker:natspass-"+randomHex(t)+"@127.0.0.1:4222")
	natsURL := os.Getenv("STEWARD_NATS_URL")
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	tools := t.TempDir()
	rec := filepath.Join(tools, "rec")
	if err := os.Mkdir(rec, 0o755); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(tools, "on-change.sh")
	if err := os.WriteFile(script, []byte(onChangeScript), 0o755); err != nil {
		t.Fatal(err)
	}
	const timeout = 2 * time.Second
	h := newHiveWith(t, js, "hive-o", func(cfg *credential.Config) {
		if err := os.Mkdir(cfg.CredentialDir, 0o755); err != nil {
			t.Fatal(err)
		}
		cfg.OnChange = script + " " + rec
		cfg.OnChangeTimeout = timeout
	})
	dir := h.cfg.CredentialDir
	// The same hive without the command: the process that "dies" after
	// swapping version 4 in, before its command runs.
	plain := h.cfg
	plain.OnChange = ""
	noCommand, err := credential.New(plain)
	if err != nil {
		t.Fatal(err)
	}
	h.handle = func(ctx context.Context, d *workers.Delivery) error {
		var data events.CredentialRotated
		if err := json.Unmarshal(d.Event.Data(), &data); err != nil {
			return err
		}
		switch {
		case data.Version == 4 && d.Attempt == 1:
			if err := noCommand.Handle(ctx, d); err != nil {
				return err
			}
			return errors.New("simulated crash after the swap, before the --on-change command")
		case data.Version == 5 && d.Attempt == 1:
			if err := h.w.Handle(ctx, d); err != nil {
				return err
			}
			return errors.New("simulated crash after the --on-change command, before the ack")
		}
		return h.w.Handle(ctx, d)
	}
	onChangeCount := onChangeCounts(h.name)
	h.start(h.w.Spec())
	onChangeOf := func(o int) credential.OnChange {
		t.Helper()
		a := workertest.DataAs[credential.Applied](t, workertest.Outcomes(h.t, h.js, credential.Name, h.name)[o], typeApplied)
		if a.OnChange == nil {
			t.Fatalf("applied outcome %d has no onChange: %+v", o, a)
		}
		return *a.OnChange
	}
	secrets := map[uint64]string{}
	rotate := func(v uint64) {
		secrets[v] = fmt.Sprintf("s3cr3t-o%d-%s", v, randomHex(t))
		h.publish(v, fmt.Sprintf("client-%d", v), h.encrypt(secrets[v]))
	}

	rotate(1)
	h.waitOutcomes(1)
	if oc := onChangeOf(0); oc.Result != credential.OnChangeSucceeded || oc.Error != "" {
		t.Fatalf("version 1: %+v", oc)
	}
	// The same version again (another event): skipped, the command not run.
	h.publish(1, "client-1", h.encrypt("s3cr3t-again-"+randomHex(t)))
	workertest.DataAs[credential.Skipped](t, h.waitOutcomes(2)[1], typeSkipped)

	// A failing command: reported, counted, logged; the pair stays.
	rotate(2)
	h.waitOutcomes(3)
	if oc := onChangeOf(2); oc.Result != credential.OnChangeFailed || oc.Error != "exit status 3" {
		t.Fatalf("version 2: %+v, want failed with exit status 3", oc)
	}
	h.checkPair("client-2", secrets[2])
	if n := onChangeCount(credential.OnChangeFailed); n != 1 {
		t.Errorf("failed runs counted: %v, want 1", n)
	}
	if !h.logged(`"level":"error"`, "the --on-change command failed; the pair of version 2 stays in place") {
		t.Error("no error line reports the failed command")
	}

	// A hanging command: killed with its process group at the timeout.
	rotate(3)
	h.waitOutcomes(4)
	oc := onChangeOf(3)
	if oc.Result != credential.OnChangeTimedOut || oc.Seconds < timeout.Seconds() || oc.Seconds > timeout.Seconds()+8 {
		t.Fatalf("version 3: %+v, want timed out after about %v", oc, timeout)
	}
	h.checkPair("client-3", secrets[3])
	raw, err := os.ReadFile(filepath.Join(rec, "child"))
	if err != nil {
		t.Fatal(err)
	}
	child, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	workertest.WaitUntil(t, "the hanging command's child is killed with its group", func() bool { return gone(child) })

	// Version 4's first delivery swaps the pair in and dies before the
	// command: the redelivery runs it.
	rotate(4)
	h.waitOutcomes(5)
	workertest.WaitIdle(t, js, h.consumer())
	// Version 5's first delivery runs the command and dies before the ack:
	// the redelivery finds the run recorded and does not run it again.
	rotate(5)
	h.waitOutcomes(6)
	workertest.WaitIdle(t, js, h.consumer())
	h.checkPair("client-5", secrets[5])

	inv, err := os.ReadFile(filepath.Join(rec, "invocations"))
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for v := 1; v <= 5; v++ {
		want = append(want, fmt.Sprintf("run %d args=%s", v, rec))
	}
	if got := strings.TrimSpace(string(inv)); got != strings.Join(want, "\n") {
		t.Fatalf("invocations:\n%s\nwant one per applied version:\n%s", got, strings.Join(want, "\n"))
	}
	if n := onChangeCount(credential.OnChangeSucceeded); n != 3 {
		t.Errorf("succeeded runs counted: %v, want 3 (versions 1, 4, 5)", n)
	}
	if n := onChangeCount(credential.OnChangeTimedOut); n != 1 {
		t.Errorf("timed-out runs counted: %v, want 1", n)
	}

	for v := uint64(1); v <= 5; v++ {
		if c, err := os.ReadFile(filepath.Join(rec, fmt.Sprintf("client-%d", v))); err != nil || string(c) != fmt.Sprintf("client-%d", v) {
			t.Errorf("version %d: the command saw client id %q (%v): the pair was not in place when it ran", v, c, err)
		}
		env, err := os.ReadFile(filepath.Join(rec, fmt.Sprintf("env-%d", v)))
		if err != nil {
			t.Fatal(err)
		}
		vars := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(string(env)), "\n") {
			k, val, _ := strings.Cut(line, "=")
			vars[k] = val
		}
		if vars["STEWARD_HIVE"] != h.name || vars["STEWARD_CREDENTIAL_VERSION"] != strconv.FormatUint(v, 10) || vars["STEWARD_CREDENTIAL_DIR"] != dir ||
			!strings.HasPrefix(vars["STEWARD_CREDENTIAL_DATA"], filepath.Join(dir, fmt.Sprintf("..v%d-", v))) {
			t.Errorf("version %d: the command's environment lacks the hive, version or folders:\n%s", v, env)
		}
		for k := range vars {
			if strings.HasPrefix(k, "STEWARD_") && k != "STEWARD_HIVE" && !strings.HasPrefix(k, "STEWARD_CREDENTIAL_") {
				t.Errorf("version %d: the worker's %s reached the command", v, k)
			}
		}
		if strings.Contains(string(env), natsURL) {
			t.Errorf("version %d: the worker's NATS password reached the command", v)
		}
	}
	everything := string(inv)
	entries, _ := os.ReadDir(rec)
	for _, e := range entries {
		b, _ := os.ReadFile(filepath.Join(rec, e.Name()))
		everything += string(b)
	}
	for _, s := range h.secrets {
		if strings.Contains(everything, string(s)) {
			t.Fatal("a secret reached the command's arguments or environment")
		}
	}
	h.assertNoSecret()
}
