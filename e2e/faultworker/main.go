// Command faultworker is the worker the e2e fault tests kill, starve and
// reconnect. It runs on the real runtime (workers.New and Run) and applies
// credential.rotated events for any number of hives the way a real worker
// applies state: per hive it writes a state file atomically, then appends a
// line to an apply log that the tests read to prove that every event was
// applied, that none was applied twice and that no hive ever went backwards.
//
// Like the credential worker, the handler never moves a hive back: a version
// not above the one on disk is not written, but it is logged as stale, so
// the tests count how often the runtime handed over an event older than one
// already applied (a crash between a handler's effect and its checkpoint
// lets that happen). A redelivery of the very event already written (same
// stream sequence) only makes sure it is logged.
//
// Usage:
//
//	faultworker --nats-url nats://127.0.0.1:4333 --instance chaos --dir /tmp/x --http-addr 127.0.0.1:9100
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/atomicfile"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// Name is the worker's name: its consumers are fault-<instance>.
const Name = "fault"

// State is what the worker keeps per hive in <dir>/state/<hive>.json.
type State struct {
	Hive     string `json:"hive"`
	Version  uint64 `json:"version"`
	ClientID string `json:"clientId"`
	Seq      uint64 `json:"seq"`
	EventID  string `json:"eventId"`
}

// Applied is one line of <dir>/applied.jsonl: one event applied.
type Applied struct {
	Hive    string `json:"hive"`
	Version uint64 `json:"version"`
	Seq     uint64 `json:"seq"`
	EventID string `json:"eventId"`
	// Prev is the version the state file held before.
	Prev uint64 `json:"prev"`
	// Recovered says the state file was written by a delivery that died
	// before it logged; this delivery only logged it.
	Recovered bool `json:"recovered,omitempty"`
	// Stale says the event was not applied: the state already held Prev,
	// a version at least as new.
	Stale bool `json:"stale,omitempty"`
	PID   int  `json:"pid"`
	// At is when the line was written (Unix nanoseconds).
	At int64 `json:"at"`
}

// LogFile and StateDir are the names under --dir.
const (
	LogFile  = "applied.jsonl"
	StateDir = "state"
)

type handler struct {
	dir string
	pid int
	// pause widens the window between the state write and the log line, so
	// kills land inside it and the recovery path is exercised.
	pause time.Duration

	mu     sync.Mutex
	log    *os.File
	logged map[uint64]bool
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "faultworker:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		natsURL     string
		instance    string
		dir         string
		httpAddr    string
		replicas    int
		ackWait     time.Duration
		concurrency int
		maxDeliver  int
		pause       time.Duration
	)
	fs := pflag.NewFlagSet("faultworker", pflag.ContinueOnError)
	fs.StringVar(&natsURL, "nats-url", nats.DefaultURL, "NATS server URL(s), comma-separated")
	fs.StringVar(&instance, "instance", "", "instance name; the consumer is fault-<instance>")
	fs.StringVar(&dir, "dir", "", "folder for the state files and the apply log")
	fs.StringVar(&httpAddr, "http-addr", "", "address for /metrics, /healthz and /readyz")
	fs.IntVar(&replicas, "replicas", 1, "replicas of the streams and the checkpoint bucket")
	fs.DurationVar(&ackWait, "ack-wait", 2*time.Second, "how long NATS waits for an ack before it redelivers")
	fs.IntVar(&concurrency, "concurrency", workers.DefaultConcurrency, "hives handled at once")
	fs.IntVar(&maxDeliver, "max-deliver", 1000, "deliveries before an event goes to the DLQ")
	fs.DurationVar(&pause, "pause", 0, "time spent between writing a hive's state and logging it")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	if instance == "" || dir == "" {
		return errors.New("--instance and --dir are required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	logger := zerolog.New(os.Stderr).With().Timestamp().Int("pid", os.Getpid()).Logger()

	h, err := open(dir, pause)
	if err != nil {
		return err
	}
	defer h.log.Close()

	nc, err := nats.Connect(natsURL,
		nats.Name("faultworker "+instance),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { logger.Warn().AnErr("error", err).Msg("NATS disconnected") }),
		nats.ReconnectHandler(func(nc *nats.Conn) { logger.Info().Str("server", nc.ConnectedUrl()).Msg("NATS reconnected") }),
	)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	spec := workers.Spec{
		Name:     Name,
		Instance: instance,
		Subjects: []string{events.EventsPrefix + ".credential.rotated.*"},
		Types:    []string{events.TypeCredentialRotated},
	}
	opts := []workers.Option{
		workers.WithLogger(logger),
		workers.WithRegisterer(reg),
		workers.WithReplicas(replicas),
		workers.WithAckWait(ackWait),
		workers.WithConcurrency(concurrency),
		workers.WithMaxDeliver(maxDeliver),
		workers.WithShutdownGrace(5 * time.Second),
		// Every process of the instance signs with the same key, so what a
		// killed process stored verifies for the next one (the test keys
		// of workertest: derived from the instance's name).
		workertest.DocumentKeys(Name, instance),
	}
	// The server may be mid-restart or electing a leader: keep trying to
	// set up until told to stop, as a supervised worker would be restarted.
	var w *workers.Runtime
	for {
		w, err = workers.New(js, spec, h, opts...)
		if err == nil {
			break
		}
		logger.Warn().Err(err).Msg("worker set-up failed; trying again")
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	if httpAddr != "" {
		ln, err := net.Listen("tcp", httpAddr)
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: ops.NewServeMux(reg, w.Ready), ReadHeaderTimeout: 5 * time.Second}
		go srv.Serve(ln)
		defer srv.Close()
	}
	return w.Run(ctx)
}

// open loads which sequences the apply log already holds, so a restarted
// process logs an event a killed one applied but did not log.
func open(dir string, pause time.Duration) (*handler, error) {
	if err := os.MkdirAll(filepath.Join(dir, StateDir), 0o755); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, LogFile)
	logged := map[uint64]bool{}
	raw, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	// A kill can land inside a line's write: the kernel stops a write to a
	// file at a page boundary when the process is killed, so the last line
	// can be cut short. Its event's state file was written first and the
	// event was not acked, so its redelivery logs it again ("recovered"):
	// the cut line is dropped, as if it had not been written. Only the
	// last line can be cut; a broken line before it is refused.
	if whole := bytes.LastIndexByte(raw, '\n') + 1; whole < len(raw) {
		if err := os.Truncate(path, int64(whole)); err != nil {
			return nil, fmt.Errorf("drop the line a kill cut short at the end of %s: %w", path, err)
		}
		raw = raw[:whole]
	}
	for line := range bytes.Lines(raw) {
		var a Applied
		if err := json.Unmarshal(line, &a); err != nil {
			return nil, fmt.Errorf("%s holds a broken line %q: %w", path, line, err)
		}
		logged[a.Seq] = true
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &handler{dir: dir, pid: os.Getpid(), pause: pause, log: f, logged: logged}, nil
}

// Handle applies one rotation: state file first (the commit point), then the
// log line.
func (h *handler) Handle(ctx context.Context, d *workers.Delivery) error {
	var data events.CredentialRotated
	if err := d.DataAs(&data); err != nil {
		return err
	}
	path := filepath.Join(h.dir, StateDir, data.Hive+".json")
	var cur State
	raw, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := json.Unmarshal(raw, &cur); err != nil {
			return workers.Permanent(fmt.Errorf("state of %s is broken: %w", data.Hive, err))
		}
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	if cur.Seq == d.Sequence {
		// An earlier delivery of this event wrote the state and died
		// before its ack; make sure it is logged, once.
		return h.append(Applied{Hive: data.Hive, Version: data.Version, Seq: d.Sequence, EventID: d.Event.ID(), Prev: cur.Version, Recovered: true}, true)
	}
	if cur.Seq != 0 && data.Version <= cur.Version {
		return h.append(Applied{Hive: data.Hive, Version: data.Version, Seq: d.Sequence, EventID: d.Event.ID(), Prev: cur.Version, Stale: true}, false)
	}
	next := State{Hive: data.Hive, Version: data.Version, ClientID: data.ClientID, Seq: d.Sequence, EventID: d.Event.ID()}
	out, err := json.Marshal(next)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(path, out, 0o644); err != nil {
		return err
	}
	if h.pause > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(h.pause):
		}
	}
	// Logged even when this sequence was logged before: applying an event
	// twice is what the tests look for, so it must show.
	return h.append(Applied{Hive: data.Hive, Version: data.Version, Seq: d.Sequence, EventID: d.Event.ID(), Prev: cur.Version}, false)
}

// append writes a line for a; with once it writes nothing when a's sequence
// is already logged.
func (h *handler) append(a Applied, once bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if once && h.logged[a.Seq] {
		return nil
	}
	a.PID, a.At = h.pid, time.Now().UnixNano()
	line, err := json.Marshal(a)
	if err != nil {
		return err
	}
	// One write per line: O_APPEND keeps lines whole even when the process
	// is killed, and fsync makes the line as durable as the state file.
	if _, err := h.log.Write(append(line, '\n')); err != nil {
		return err
	}
	if err := h.log.Sync(); err != nil {
		return err
	}
	h.logged[a.Seq] = true
	return nil
}
