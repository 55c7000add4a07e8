package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/fleet"
)

// Env is a JetStream server, embedded with its store in a temporary folder
// (Start), run as a process of its own (StartProcess) or reached at a URL
// (Dial), and a publishing and a consuming connection to it.
type Env struct {
	srv *server.Server
	// node is the server's process, when it runs in one of its own: its
	// CPU counts in every path's CPU per event, as the embedded server's
	// does by being in this process.
	node  *fleet.Servers
	url   string
	dir   string
	pubNC *nats.Conn
	subNC *nats.Conn
	pubJS jetstream.JetStream
	subJS jetstream.JetStream
	// nonce sets this Env's event ids apart from any other's on the same
	// server: an external path's program publishes to the plain stream
	// too, and the stream's duplicate window would drop an event whose id
	// an earlier run used.
	nonce string
	runs  int
	// spoil, set only by tests, changes the raw paths' messages before
	// they go out.
	spoil func([]*nats.Msg)
}

// Start starts an embedded server and sets up what every path reads:
// Steward's streams and checkpoint bucket as `steward setup` makes them,
// and the raw paths' streams.
func Start(ctx context.Context) (*Env, error) {
	dir, err := os.MkdirTemp("", "steward-bench-")
	if err != nil {
		return nil, err
	}
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: dir, NoLog: true, NoSigs: true,
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	srv.Start()
	e := &Env{srv: srv, dir: dir}
	if !srv.ReadyForConnections(10 * time.Second) {
		e.Close()
		return nil, errors.New("embedded NATS did not become ready in 10s")
	}
	if err := e.setUp(ctx, srv.ClientURL()); err != nil {
		return nil, err
	}
	return e, nil
}

// StartProcess is Start with the server in a process of its own, command
// with "-c <config>" after it (this binary's hidden `bench fleet-server`,
// or a nats-server binary), as a deployed worker meets its server: the
// consumers then share their garbage collector with nobody but the bench's
// publisher, and talk to the server through loopback.
func StartProcess(ctx context.Context, command []string) (*Env, error) {
	dir, err := os.MkdirTemp("", "steward-bench-")
	if err != nil {
		return nil, err
	}
	e := &Env{dir: dir}
	if e.node, err = fleet.StartServers(ctx, command, dir, 1); err != nil {
		e.Close()
		return nil, fmt.Errorf("nats-server in its own process: %w", err)
	}
	if err := e.setUp(ctx, e.node.URLs()); err != nil {
		return nil, err
	}
	return e, nil
}

// setUp connects to the server at url and sets up what every path reads,
// as Start says; on failure it closes e, server and all.
func (e *Env) setUp(ctx context.Context, url string) error {
	err := e.connect(ctx, url)
	if err == nil {
		err = events.SetupBus(ctx, e.pubJS, events.DefaultBusConfig(1))
	}
	if err != nil {
		e.Close()
	}
	return err
}

// cpuUse is CPU time the bench's processes have used: all of it, and the
// part of it that is the server's when the server runs in a process of
// its own (zero when it is embedded, where its CPU is this process's and
// cannot be told apart).
type cpuUse struct {
	all, server time.Duration
}

// since is the CPU used between start and u.
func (u cpuUse) since(start cpuUse) cpuUse {
	return cpuUse{all: u.all - start.all, server: u.server - start.server}
}

// cpu is the CPU time used so far by this process and, when the server
// runs in its own, by the server's, with the server's part apart: what a
// path's CPU per event and its server's part count.
func (e *Env) cpu() cpuUse {
	c := cpuUse{all: processCPU()}
	if e.node != nil {
		// A server that has gone makes its path fail on its own; its CPU
		// is then no figure anyone reads.
		if sc, err := e.node.Nodes[0].CPU(); err == nil {
			c.all += sc
			c.server = sc
		}
	}
	return c
}

// Dial connects to the JetStream server at url and makes sure the raw
// paths' streams are there, as Start makes them: what an external path's
// program does.
func Dial(ctx context.Context, url string) (*Env, error) {
	e := &Env{}
	if err := e.connect(ctx, url); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// connect opens the two connections to url and creates or updates the raw
// paths' streams.
func (e *Env) connect(ctx context.Context, url string) error {
	e.url = url
	e.nonce = strconv.FormatInt(time.Now().UnixNano(), 36)
	var err error
	for _, c := range []**nats.Conn{&e.pubNC, &e.subNC} {
		if *c, err = nats.Connect(url); err != nil {
			return fmt.Errorf("connect to %s: %w", url, err)
		}
	}
	if e.pubJS, err = jetstream.New(e.pubNC, jetstream.WithPublishAsyncMaxPending(1024)); err != nil {
		return err
	}
	if e.subJS, err = jetstream.New(e.subNC); err != nil {
		return err
	}
	for _, cfg := range streams() {
		if _, err := e.pubJS.CreateOrUpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("create or update stream %s: %w", cfg.Name, err)
		}
	}
	return nil
}

// URL is where the server listens for clients.
func (e *Env) URL() string { return e.url }

// Close closes the connections and, when the server is embedded, stops it
// and removes its store.
func (e *Env) Close() {
	for _, nc := range []*nats.Conn{e.pubNC, e.subNC} {
		if nc != nil {
			nc.Close()
		}
	}
	if e.srv != nil {
		e.srv.Shutdown()
		e.srv.WaitForShutdown()
	}
	if e.node != nil {
		e.node.Close()
	}
	if e.dir != "" {
		os.RemoveAll(e.dir)
	}
}

// messages encodes n valid credential.rotated events over keys keys, once
// per run, so every path carries the same bytes and the cost of building
// them is in no measure.
func (e *Env) messages(run, n, keys int) ([]*nats.Msg, error) {
	out := make([]*nats.Msg, n)
	for i := range n {
		hive := "h" + strconv.Itoa(i%keys)
		ev, err := events.New(events.TypeCredentialRotated, hive, events.CredentialRotated{
			Hive: hive, Version: uint64(i + 1), ClientID: "bench",
			Secret: "-----BEGIN AGE ENCRYPTED FILE-----\nYmVuY2g=\n-----END AGE ENCRYPTED FILE-----\n",
		})
		if err != nil {
			return nil, err
		}
		ev.SetID(e.idPrefix(run) + strconv.Itoa(i))
		ev.SetSource("/steward/bench")
		ev.SetTime(time.Now().UTC())
		if err := events.Validate(ev); err != nil {
			return nil, err
		}
		k, _ := events.Lookup(ev.Type())
		subject, err := k.SubjectFor(hive)
		if err != nil {
			return nil, err
		}
		if out[i], err = events.Encode(subject, ev); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// idPrefix starts the id of every event of run.
func (e *Env) idPrefix(run int) string { return "bench-" + e.nonce + "-" + strconv.Itoa(run) + "-" }

// stallWait is how long a publish waits for room among the 1,024 acks
// the publisher may await: nats.go's 200 ms default fails a burst on a
// loaded machine, where the server falls behind for longer; waiting slows
// the publisher, as the server does.
var stallWait = jetstream.WithStallWait(30 * time.Second)

// waitTurn waits until the i-th of a series paced at rate a second from
// start is due, at once when rate is 0 (one burst). The pace is kept
// against the start, so a slow step is caught up rather than stretching
// the whole series.
func waitTurn(ctx context.Context, start time.Time, i, rate int) error {
	if rate <= 0 {
		return nil
	}
	wait := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate)))
	if wait <= 0 {
		return nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// publish sends msgs asynchronously, as one burst or paced at rate per
// second, noting when each left, and waits for every publish ack.
func (e *Env) publish(ctx context.Context, t *tracker, msgs []*nats.Msg, rate int) error {
	futures := make([]jetstream.PubAckFuture, len(msgs))
	t.cpu, t.heap = t.cpuNow(), heapNow()
	start := time.Now()
	for i, m := range msgs {
		if err := waitTurn(ctx, start, i, rate); err != nil {
			return err
		}
		t.sent[i].Store(time.Now().UnixNano())
		f, err := e.pubJS.PublishMsgAsync(m, stallWait)
		if err != nil {
			return fmt.Errorf("publish %d: %w", i, err)
		}
		futures[i] = f
	}
	select {
	case <-e.pubJS.PublishAsyncComplete():
		t.published.Store(time.Now().UnixNano())
	case <-ctx.Done():
		return fmt.Errorf("waiting for publish acks: %w", ctx.Err())
	}
	for i, f := range futures {
		select {
		case err := <-f.Err():
			return fmt.Errorf("publish %d: %w", i, err)
		case ack := <-f.Ok():
			if ack.Duplicate {
				// It would never be delivered, and the path would wait
				// for it until its timeout.
				return fmt.Errorf("publish %d: stream %s took event %s for a duplicate of an earlier one", i, ack.Stream, f.Msg().Header.Get(idHeader))
			}
		default:
		}
	}
	return nil
}

func (e *Env) wait(ctx context.Context, t *tracker, path string, progress func(string, int, int)) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-t.all:
			return nil
		case <-tick.C:
			if progress != nil {
				progress(path, int(t.done.Load()), len(t.settled))
			}
		case <-ctx.Done():
			return fmt.Errorf("%s: %d of %d events settled before %w", path, t.done.Load(), len(t.settled), ctx.Err())
		}
	}
}

// deleteConsumer removes a path's consumer once its turn is over. A
// failure costs only fairness, since a consumer left behind is one more the
// server considers on every publish, so it is not an error.
func (e *Env) deleteConsumer(stream, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = e.pubJS.DeleteConsumer(ctx, stream, name)
}

func (e *Env) purge(ctx context.Context, stream string) error {
	s, err := e.pubJS.Stream(ctx, stream)
	if err != nil {
		return err
	}
	return s.Purge(ctx)
}

// starter begins a path's consumer of t's events on the stream its turn
// publishes to; the stop it returns ends the consumer and removes what it
// created on the server.
type starter func(ctx context.Context, t *tracker) (stop func(), err error)

// consume is one turn of a path: it makes o.Events events, reshape
// changing them for the path's stream if it is set, empties stream,
// starts the path's consumer, publishes, and waits until every event is
// settled or o.Timeout has passed.
func (e *Env) consume(ctx context.Context, o Options, name, stream string, reshape func([]*nats.Msg), start starter) (Measure, error) {
	o = o.withDefaults()
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	e.runs++
	msgs, err := e.messages(e.runs, o.Events, o.Keys)
	if err != nil {
		return Measure{}, err
	}
	if reshape != nil {
		reshape(msgs)
	}
	if e.spoil != nil {
		e.spoil(msgs)
	}
	// Earlier turns' events would be delivered too: start from an empty
	// stream.
	if err := e.purge(ctx, stream); err != nil {
		return Measure{}, err
	}
	t := newTracker(e.idPrefix(e.runs), o.Events, e.cpu)
	stop, err := start(ctx, t)
	if err != nil {
		return Measure{}, fmt.Errorf("%s: %w", name, err)
	}
	defer stop()
	if o.measuring != nil {
		o.measuring()
	}
	if err := e.publish(ctx, t, msgs, o.Rate); err != nil {
		return Measure{}, err
	}
	if err := e.wait(ctx, t, name, o.Progress); err != nil {
		return Measure{}, err
	}
	return t.measure(), nil
}
