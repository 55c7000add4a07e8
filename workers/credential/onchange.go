package credential

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers"
)

// Results of the --on-change command, in the applied outcome and in
// OnChangeTotal's result label.
const (
	OnChangeSucceeded = "succeeded"
	OnChangeFailed    = "failed"
	OnChangeTimedOut  = "timed_out"
)

// OnChange is what the --on-change command did for an applied version. It
// never holds the command's output, which could hold the secret.
type OnChange struct {
	// Result is succeeded, failed or timed_out.
	Result string `json:"result"`
	// Error says how it failed: its exit status, or that it was killed at
	// the timeout.
	Error string `json:"error,omitempty"`
	// Seconds is how long it ran.
	Seconds float64 `json:"seconds"`
}

// OnChangeTotal counts --on-change runs by hive and result. The runtime's
// registerer is not reachable from a handler, so it is registered once with
// prometheus.DefaultRegisterer when a worker with --on-change is made; a
// binary serving its own registry shows it by registering OnChangeTotal
// there too. The applied outcome's onChange field reports each run as well.
var OnChangeTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "steward_credential_on_change_total",
	Help: "Runs of the credential worker's --on-change command, by hive and result: succeeded, failed, timed_out.",
}, []string{"hive", "result"})

var registerOnce sync.Once

// registerMetrics registers OnChangeTotal with the default registerer once
// per process; several workers in one process (steward dev) share it.
func registerMetrics() {
	registerOnce.Do(func() {
		// An error is only a clash with another collector of that name: the
		// counter still counts, and the outcome still reports every run.
		_ = prometheus.DefaultRegisterer.Register(OnChangeTotal)
	})
}

// onChangeState names the worker-instance state document recording the
// last version the --on-change command ran for.
const onChangeState = "on-change"

// announced is that record: the version and the version folder the command
// ran for, and what it did.
type announced struct {
	Version  uint64   `json:"version"`
	Folder   string   `json:"folder"`
	OnChange OnChange `json:"onChange"`
}

// announce runs the --on-change command for the pair res applied, once per
// applied version. Whether it already ran is recorded in the worker's state
// (d.State()), keyed by the version folder, not decided by the path taken:
//   - a redelivery that finds its own folder in place (its stage) and no
//     record for it runs the command: the delivery that swapped the pair in
//     died before the command ran, and nobody has been told of the pair;
//   - a redelivery that finds the record (the command ran, then the emit or
//     the ack was lost) reports the recorded run and does not run it again;
//   - a stale or equal version is skipped before this and runs nothing.
//
// The record is written after the command, so a process that dies while the
// command runs runs it again on redelivery: at least once per applied
// version, exactly once unless the process dies between the command's end
// and the record. A failed or timed-out command is reported (the outcome's
// onChange, an error line, OnChangeTotal) and never rolls the pair back: the
// pair is the desired state; the command only tells others of it.
func (w *Worker) announce(ctx context.Context, d *workers.Delivery, data events.CredentialRotated, res *result) error {
	where := fmt.Sprintf("hive %s, event %s", data.Hive, d.Event.ID())
	log := d.Log.With().Str("hive", data.Hive).Uint64("version", data.Version).Logger()
	app := res.data.(Applied)
	var last announced
	rev, err := d.State().Get(ctx, onChangeState, &last)
	if err != nil {
		err = fmt.Errorf("%s: version %d is in place, but whether the --on-change command ran for it cannot be read (%w), so it was not run; the worker retries", where, data.Version, err)
		log.Error().Str("error", err.Error()).Msg("on-change record unreadable; the event is retried")
		return err
	}
	if last.Version == data.Version && last.Folder == res.folder {
		log.Info().Str("result", last.OnChange.Result).Msg("the --on-change command already ran for this version; not run again")
		app.OnChange = &last.OnChange
		res.data = app
		return nil
	}
	oc, err := w.runOnChange(ctx, data.Version, res.folder)
	if err != nil {
		// The worker is stopping: the command was cut short, not judged.
		// Nothing is recorded, so the redelivery runs it again.
		return fmt.Errorf("%s: version %d is in place, but the --on-change command was stopped with the worker (%w); it runs again on redelivery", where, data.Version, err)
	}
	OnChangeTotal.WithLabelValues(data.Hive, oc.Result).Inc()
	if oc.Result == OnChangeSucceeded {
		log.Info().Float64("seconds", oc.Seconds).Msg("the --on-change command succeeded")
	} else {
		log.Error().Str("result", oc.Result).Str("error", oc.Error).Float64("seconds", oc.Seconds).
			Msgf("the --on-change command %s; the pair of version %d stays in place and the command is not run again for it", oc.Result, data.Version)
	}
	if _, err := d.State().Put(ctx, onChangeState, announced{Version: data.Version, Folder: res.folder, OnChange: oc}, rev); err != nil {
		// Not retried: a retry would run the command again, the very thing
		// the record is there to prevent. Only a redelivery of this event
		// (a lost emit or ack) would, and then the command runs twice.
		log.Error().Str("error", fmt.Sprintf("%s: %v", where, err)).Msg("the --on-change command ran but the record of it was not written; a redelivery of this event would run it again")
	}
	app.OnChange = &oc
	res.data = app
	return nil
}

// onChangeEnv is the command's whole environment: what it needs to act on
// the new pair (the hive, the version, the credential folder and the
// version folder holding the matched pair) and the few variables a shell
// expects. Nothing else of the worker's environment is passed: it may hold
// what the command has no business seeing (a NATS URL with a password, OTLP
// headers with a token), and the secret is never in it.
func (w *Worker) onChangeEnv(version uint64, folder string) []string {
	env := []string{
		"STEWARD_HIVE=" + w.hive,
		"STEWARD_CREDENTIAL_VERSION=" + strconv.FormatUint(version, 10),
		"STEWARD_CREDENTIAL_DIR=" + w.dir,
		"STEWARD_CREDENTIAL_DATA=" + filepath.Join(w.dir, folder),
	}
	for _, k := range []string{"PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// runOnChange runs the command with /bin/sh -c, as consul-template runs its
// command, in a process group of its own so the timeout kills whatever it
// started too. Its output is discarded: it could print the secret, and the
// worker's logs and outcomes never hold one (a command that wants a log
// redirects its own output). The error is only the worker stopping.
func (w *Worker) runOnChange(ctx context.Context, version uint64, folder string) (OnChange, error) {
	cctx, cancel := context.WithTimeout(ctx, w.onChangeTimeout)
	defer cancel()
	cmd := exec.CommandContext(cctx, "/bin/sh", "-c", w.onChange)
	cmd.Env = w.onChangeEnv(version, folder)
	cmd.Dir = w.dir
	ownProcessGroup(cmd)
	// Should a killed command's orphan hold a descriptor, Wait gives up
	// waiting for it after this.
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	err := cmd.Run()
	oc := OnChange{Result: OnChangeSucceeded, Seconds: time.Since(start).Seconds()}
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return oc, ctx.Err()
	case errors.Is(cctx.Err(), context.DeadlineExceeded):
		oc.Result = OnChangeTimedOut
		oc.Error = fmt.Sprintf("still running after %v, so its process group was killed", w.onChangeTimeout)
	default:
		oc.Result = OnChangeFailed
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			oc.Error = exit.String()
		} else {
			oc.Error = err.Error()
		}
	}
	return oc, nil
}
