package workers_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/pflag"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// MOTDConfig is the fifth worker's configuration: which hive it serves and
// where it writes the hive's credential client id as a message of the day.
type MOTDConfig struct {
	Hive string
	Path string
}

// AddFlags registers --hive and --motd-path; `steward worker motd` reads
// them, and STEWARD_HIVE and STEWARD_MOTD_PATH are their twins.
func (c *MOTDConfig) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Hive, "hive", c.Hive, "the hive whose rotations this worker follows")
	fs.StringVar(&c.Path, "motd-path", c.Path, "the file the current client id is written to")
}

// MOTD is the worker: a Handler with its Spec, and Close, which is what
// `steward worker` runs.
type MOTD struct{ cfg MOTDConfig }

// NewMOTD checks the configuration, so a worker that cannot work fails at
// start rather than on every event.
func NewMOTD(cfg MOTDConfig) (*MOTD, error) {
	if events.CheckKey(cfg.Hive) != nil || cfg.Path == "" {
		return nil, errors.New("--hive and --motd-path are required")
	}
	return &MOTD{cfg: cfg}, nil
}

// Spec consumes the hive's rotations, newest wins.
func (m *MOTD) Spec() workers.Spec {
	k, _ := events.Lookup(events.TypeCredentialRotated)
	return workers.Spec{
		Name: "motd", Instance: m.cfg.Hive,
		Subjects: []string{k.FilterSubject(m.cfg.Hive)},
		Types:    []string{events.TypeCredentialRotated},
		Rank: func(_ context.Context, d *workers.Delivery) (uint64, error) {
			var r events.CredentialRotated
			if err := d.DataAs(&r); err != nil {
				return 0, err
			}
			return r.Version, nil
		},
	}
}

// Handle writes the client id and reports it; an older version than the
// one in its State is refused, a file it cannot write is retried.
func (m *MOTD) Handle(ctx context.Context, d *workers.Delivery) error {
	var r events.CredentialRotated
	if err := d.DataAs(&r); err != nil {
		return err
	}
	var shown struct{ Version uint64 }
	rev, err := d.State().Get(ctx, "shown", &shown)
	if err != nil {
		return err
	}
	if r.Version <= shown.Version {
		if err := d.Emit(ctx, "refused", map[string]any{"version": r.Version, "shown": shown.Version}); err != nil {
			return err
		}
		return workers.Refused(fmt.Errorf("version %d is not above %d", r.Version, shown.Version))
	}
	if err := os.WriteFile(m.cfg.Path, []byte("client "+r.ClientID+"\n"), 0o644); err != nil {
		return err // retried: a person can fix the folder
	}
	shown.Version = r.Version
	if _, err := d.State().Put(ctx, "shown", shown, rev); err != nil {
		return err
	}
	return d.Emit(ctx, "shown", map[string]any{"version": r.Version, "clientId": r.ClientID})
}

// Close holds nothing.
func (m *MOTD) Close() error { return nil }

// DevMOTD is `steward dev`'s instance: a file under dir.
func DevMOTD(_ context.Context, dir string) (MOTDConfig, []string, error) {
	return MOTDConfig{Hive: "dev", Path: filepath.Join(dir, "motd")}, nil, nil
}

// Example_customWorker writes a fifth worker, tests it and registers it.
//
// A worker is a Config with AddFlags, a New that returns the worker
// (Handle, Spec, Close) and a Dev for `steward dev`. Its Handle sees only
// the Delivery: decode the data, decide, act, emit the outcome; nil is
// applied, workers.Refused a policy refusal, workers.Permanent a dead
// letter, any other error a retry.
//
// workertest runs it with no server. A Runner keeps the State between
// events; the Result says what each event became and what was emitted.
//
// Registering it is one line in cmd/steward/kinds.go:
//
//	define("motd", (*MOTDConfig).AddFlags, NewMOTD, DevMOTD),
//
// which gives it `steward worker motd`, `steward replay motd` and a place
// in `steward dev`; the command then builds the worker as below, from its
// flags.
func Example_customWorker() {
	// In a test, use the test's own t; an example has none, so exampleTB
	// panics on the first failure, which fails the example all the same.
	var t testing.TB = exampleTB{}

	// As `steward worker motd --hive h1 --motd-path ...` would build it.
	var cfg MOTDConfig
	fs := pflag.NewFlagSet("motd", pflag.ContinueOnError)
	cfg.AddFlags(fs)
	dir, _ := os.MkdirTemp("", "motd")
	defer os.RemoveAll(dir)
	if err := fs.Parse([]string{"--hive", "h1", "--motd-path", filepath.Join(dir, "motd")}); err != nil {
		panic(err)
	}
	svc, err := NewMOTD(cfg)
	if err != nil {
		panic(err)
	}

	r := workertest.NewRunner(t, svc.Spec(), svc)
	rotated := func(v uint64) events.CredentialRotated {
		return events.CredentialRotated{Hive: "h1", Version: v, ClientID: fmt.Sprintf("client-%d", v), Secret: "-----BEGIN AGE ENCRYPTED FILE-----\nx\n-----END AGE ENCRYPTED FILE-----"}
	}
	res := r.WorkData(events.TypeCredentialRotated, "h1", rotated(2))
	fmt.Println(res.Verdicts(), res.OutcomeNames(), string(res.State["shown"]))

	res = r.WorkData(events.TypeCredentialRotated, "h1", rotated(1))
	fmt.Println(res.Verdicts(), res.OutcomeNames(), res.Err())

	motd, _ := os.ReadFile(filepath.Join(dir, "motd"))
	fmt.Print(string(motd))
	// Output:
	// [applied] [shown] {"Version":2}
	// [refused] [refused] version 1 is not above 2
	// client client-2
}

// exampleTB is the testing.TB an example hands to workertest, which
// reports through it: the first failure panics with the message. (A zero
// testing.T is no substitute: its Fatal ends the example's goroutine.)
// Only the methods workertest calls in memory are implemented; the
// embedded interface is nil.
type exampleTB struct{ testing.TB }

func (exampleTB) Helper()                           {}
func (exampleTB) Error(args ...any)                 { panic(fmt.Sprint(args...)) }
func (exampleTB) Errorf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (exampleTB) Fatal(args ...any)                 { panic(fmt.Sprint(args...)) }
func (exampleTB) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
