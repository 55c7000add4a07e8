// Package workertest runs Steward handlers in tests, with or without a
// server.
//
// In memory, with no server: Work runs one event through a handler and
// returns a Result, what the run did (each event's Verdict, the outcomes
// emitted, dead letters, stages saved, state written, errors), in the
// style of rivertest's Worker.Work and httptest's ResponseRecorder. As
// rivertest runs river's real executor, Work runs the runtime's own engine
// (its keyed queue, executor and settler) over a bucket and streams kept
// in memory, so its rules are the runtime's and not a copy: nil is
// Applied, workers.Refused is Refused, workers.Permanent is DeadLettered
// with its reason, a plain error is Retried (or tried again, up to
// WithAttempts times, so a transient failure can be shown to apply once it
// passes), a panic is caught, and under a latest-wins Spec the older
// events of a stream queued together are Superseded. Runner keeps state
// between events and documents what differs from a server (backoff,
// crashes, redelivery).
//
// Recorded streams: `steward export` writes JSONL; ReplayFile takes the
// test's testing.TB and that file, replays it through a handler (in memory,
// or on an embedded server with WithRuntime), and the Result's Assert
// methods, OutcomeAs and StateAs check what happened. The credential
// worker's Example_replayRecordedStream shows a platform team doing it.
//
// On a real embedded server: StartServer (or StartCluster) starts
// JetStream in a temporary folder; Publish, PublishData and PublishFile
// publish; Start runs the real runtime; WaitIdle waits until its consumer
// has settled everything; Outcomes and DeadLetters read what it did.
package workertest

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/internal/streamread"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/internal/enginetest"
	"github.com/steward-dev/steward/workers/replay"
)

// DefaultTimeout bounds every wait in this package.
const DefaultTimeout = 30 * time.Second

// Server is an embedded nats-server with JetStream, its store in a
// temporary folder that is removed when the test ends.
type Server struct {
	*server.Server
	opts *server.Options
}

// StartServer starts a JetStream server on a free 127.0.0.1 port.
func StartServer(t testing.TB) *Server {
	t.Helper()
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		JetStream: true,
		StoreDir:  t.TempDir(),
		NoLog:     true,
		NoSigs:    true,
	}
	s := &Server{opts: opts}
	s.start(t)
	t.Cleanup(s.Shutdown)
	return s
}

func (s *Server) start(t testing.TB) {
	t.Helper()
	srv, err := server.NewServer(s.opts)
	if err != nil {
		t.Fatalf("nats server: %v", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server did not become ready in 10s")
	}
	s.Server = srv
	// Keep the port, so a restart comes back where clients reconnect.
	s.opts.Port = srv.Addr().(*net.TCPAddr).Port
}

// Restart shuts the server down and starts it again on the same port and
// store, as an operator's restart would.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Server.Shutdown()
	s.Server.WaitForShutdown()
	s.start(t)
}

// URL is the nats:// URL to connect to.
func (s *Server) URL() string { return s.ClientURL() }

// Connect opens a client connection that reconnects forever and is closed
// when the test ends.
func (s *Server) Connect(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("connect %s: %v", s.URL(), err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// JetStream connects and ensures Steward's streams.
func (s *Server) JetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(s.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := events.EnsureStreams(context.Background(), js, events.DefaultStreamConfig()); err != nil {
		t.Fatal(err)
	}
	return js
}

// Publish publishes e through the Publisher (validation, dedupe id) and
// fails the test if it is refused.
func Publish(t testing.TB, js jetstream.JetStream, e event.Event) publisher.Ack {
	t.Helper()
	ack, err := publisher.New(js).Publish(context.Background(), e)
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	return ack
}

// PublishData builds an event of typ for key with data and publishes it.
func PublishData(t testing.TB, js jetstream.JetStream, typ, key string, data any) publisher.Ack {
	t.Helper()
	e, err := events.New(typ, key, data)
	if err != nil {
		t.Fatal(err)
	}
	return Publish(t, js, e)
}

// PublishFile publishes a recorded stream: CloudEvents in the JSON format,
// one per line, in order.
func PublishFile(t testing.TB, js jetstream.JetStream, path string) []publisher.Ack {
	t.Helper()
	list := ReadFile(t, path)
	acks := make([]publisher.Ack, 0, len(list))
	for _, e := range list {
		acks = append(acks, Publish(t, js, e))
	}
	return acks
}

// Running is a worker running in the background of a test.
type Running struct {
	*workers.Runtime
	cancel context.CancelFunc
	done   chan error
	// js, h and opts are what it was started with, for Replayer.
	js   jetstream.JetStream
	h    workers.Handler
	opts []workers.Option
}

// Replayer is a replay.Replayer of the running worker's handler, with the
// options it was started with (its document keys among them, so it reads
// the state the worker wrote): a test replays the stream through the
// handler outside the consumer, as `steward replay` does.
func (r *Running) Replayer(t testing.TB) *replay.Replayer {
	t.Helper()
	rp, err := replay.New(context.Background(), r.js, r.Spec(), r.h, r.opts...)
	if err != nil {
		t.Fatalf("replay of %s: %v", r.ConsumerName(), err)
	}
	return rp
}

// Start creates the worker and runs it until Stop or the end of the test.
// Metrics go to a fresh registry unless an option says otherwise.
func Start(t testing.TB, js jetstream.JetStream, spec workers.Spec, h workers.Handler, opts ...workers.Option) *Running {
	t.Helper()
	opts = append([]workers.Option{workers.WithRegisterer(prometheus.NewRegistry()), DocumentKeys(spec.Name, spec.Instance)}, opts...)
	w, err := workers.New(js, spec, h, opts...)
	if err != nil {
		t.Fatalf("worker %s: %v", spec.Name, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Running{Runtime: w, cancel: cancel, done: make(chan error, 1), js: js, h: h, opts: opts}
	started := make(chan error, 1)
	go func() {
		err := w.Run(ctx)
		started <- err
		r.done <- err
	}()
	// Run ensures the streams, the bucket and the consumer first: a
	// failure there ends Run at once, and the test hears why.
	WaitUntil(t, "worker "+w.ConsumerName()+" is ready", func() bool {
		select {
		case err := <-started:
			t.Fatalf("worker %s stopped before it was ready: %v", w.ConsumerName(), err)
		default:
		}
		return w.Ready() == nil
	})
	t.Cleanup(func() { r.Stop() })
	return r
}

// Stop shuts the worker down gracefully and waits for Run to return.
func (r *Running) Stop() error {
	r.cancel()
	err, ok := <-r.done
	if !ok {
		return nil
	}
	close(r.done)
	return err
}

// WaitUntil polls cond until it holds, failing the test after
// DefaultTimeout with what it waited for.
func WaitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	waitUntil(t, func() string { return what }, cond)
}

// waitUntil is WaitUntil with a description read when it times out, so it
// can say the last state seen.
func waitUntil(t testing.TB, what func() string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(DefaultTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", DefaultTimeout, what())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// WaitIdle waits until the worker instance whose consumer name is
// consumer ("<worker>-<instance>") has settled every event stored for its
// subjects (ops.Settled: acknowledged through its durable consumer, or
// its stream cursor past the last event when it reads the stream). Events
// published before the call are covered even when they were not delivered
// yet.
func WaitIdle(t testing.TB, js jetstream.JetStream, consumer string) {
	t.Helper()
	worker, instance, _ := strings.Cut(consumer, "-")
	var state string
	waitUntil(t, func() string { return consumer + " is idle (" + state + ")" }, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		idle, s, err := ops.Settled(ctx, js, worker, instance)
		if state = s; err != nil {
			state = err.Error()
		}
		return idle
	})
}

// Outcomes returns the outcomes a worker instance has emitted, in order.
func Outcomes(t testing.TB, js jetstream.JetStream, worker, instance string) []event.Event {
	t.Helper()
	var out []event.Event
	err := streamread.Each(context.Background(), js, streamread.Range{
		Stream:   events.StreamOutcomes,
		Subjects: []string{events.OutcomesPrefix + "." + worker + "." + instance},
	}, func(m jetstream.Msg) error {
		e, err := events.Decode(m.Headers(), m.Data())
		if err != nil {
			return err
		}
		out = append(out, e)
		return nil
	})
	if err != nil {
		t.Fatalf("outcomes of %s-%s: %v", worker, instance, err)
	}
	return out
}

// DeadLetters returns the dead letters of a worker instance, in order.
func DeadLetters(t testing.TB, js jetstream.JetStream, worker, instance string) []events.DeadLetter {
	t.Helper()
	var out []events.DeadLetter
	err := streamread.Each(context.Background(), js, streamread.Range{
		Stream:   events.StreamDLQ,
		Subjects: []string{events.DLQSubject(worker, instance)},
	}, func(m jetstream.Msg) error {
		meta, err := m.Metadata()
		if err != nil {
			return err
		}
		out = append(out, events.ParseDeadLetter(meta.Sequence.Stream, m.Subject(), m.Headers(), m.Data()))
		return nil
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("dead letters of %s-%s: %v", worker, instance, err)
	}
	return out
}

// StatusEvery makes a runtime write its status document (the keys it
// retries and waits on, what it found forged) at most every d instead of
// every five seconds, so a test sees it change without waiting.
func StatusEvery(d time.Duration) workers.Option {
	return enginetest.StatusInterval(d).(workers.Option)
}

// ResyncEvery makes a stream-reading runtime read its subjects again with
// nothing to wake it every d instead of every five minutes.
func ResyncEvery(d time.Duration) workers.Option { return enginetest.Resync(d).(workers.Option) }
