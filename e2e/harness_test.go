package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/streamread"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers/workertest"
)

// bins are the binaries TestMain builds once, without -race whatever the
// test binary was built with, so the child processes run at full speed.
var bins struct {
	dir         string
	nats        string
	steward     string
	faultworker string
}

// repoRoot is the module's root, where compose.yaml and deploy/ live.
var repoRoot string

func TestMain(m *testing.M) {
	code, err := setup(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func setup(m *testing.M) (int, error) {
	root, err := filepath.Abs("..")
	if err != nil {
		return 0, err
	}
	repoRoot = root
	dir, err := os.MkdirTemp("", "steward-e2e-bin-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	// Every user may run them: the private PostgreSQL runs as postgres and
	// the tests hand it nothing but paths.
	if err := os.Chmod(dir, 0o755); err != nil {
		return 0, err
	}
	bins.dir = dir
	bins.nats = filepath.Join(dir, "nats-server")
	bins.steward = filepath.Join(dir, "steward")
	bins.faultworker = filepath.Join(dir, "faultworker")
	for out, pkg := range map[string]string{
		bins.nats:        "github.com/nats-io/nats-server/v2",
		bins.steward:     "./cmd/steward",
		bins.faultworker: "./e2e/faultworker",
	} {
		cmd := exec.Command("go", "build", "-o", out, pkg)
		cmd.Dir = root
		if msg, err := cmd.CombinedOutput(); err != nil {
			return 0, fmt.Errorf("go build %s: %v\n%s", pkg, err, msg)
		}
	}
	return m.Run(), nil
}

// summary logs a test's figures and prints them as one plain line, so a CI
// log shows them whether or not -v is given.
func summary(t testing.TB, name string, figures ...any) {
	t.Helper()
	var b strings.Builder
	for i := 0; i+1 < len(figures); i += 2 {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%v=%v", figures[i], figures[i+1])
	}
	t.Logf("figures: %s", b.String())
	fmt.Printf("e2e summary: %s %s\n", name, b.String())
}

// waitFor polls cond until it holds and returns how long that took; after
// timeout it fails the test with what it waited for and cond's last word.
func waitFor(t testing.TB, what string, timeout time.Duration, cond func() (bool, string)) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, last := cond()
		if ok {
			return time.Since(start)
		}
		select {
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting until %s (last: %s)", timeout, what, last)
		case <-tick.C:
		}
	}
}

// proc is a child process the test starts, kills and restarts. Its output
// goes to one log file across restarts, shown when the test fails.
type proc struct {
	t    testing.TB
	name string
	path string
	args []string
	env  []string
	dir  string
	// cred runs the process as another user (PostgreSQL refuses root).
	cred *syscall.Credential
	log  string

	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{}
	exit     error
	exitedAt time.Time
	starts   int
}

// baseEnv is the test's environment without anything that could configure
// Steward or libpq behind the test's back.
func baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "STEWARD_") || strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "NATS_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "PATH="+bins.dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

func newProc(t testing.TB, name, path string, args []string, env []string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, path: path, args: args, env: append(baseEnv(), env...), log: filepath.Join(t.TempDir(), name+".log")}
	t.Cleanup(func() {
		if p.running() {
			p.signal(syscall.SIGTERM)
			if _, ok := p.wait(15 * time.Second); !ok {
				p.signal(syscall.SIGKILL)
				p.wait(5 * time.Second)
			}
		}
		// STEWARD_E2E_LOGS=1 shows the processes' logs of passing tests too.
		if t.Failed() || os.Getenv("STEWARD_E2E_LOGS") != "" {
			t.Logf("--- last lines of %s (%s) ---\n%s", p.name, p.log, p.tail(40))
		}
	})
	return p
}

// start starts the process (again).
func (p *proc) start() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.done != nil {
		select {
		case <-p.done:
		default:
			p.t.Fatalf("%s is already running", p.name)
		}
	}
	out, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	p.starts++
	fmt.Fprintf(out, "=== start %d: %s %s\n", p.starts, p.path, strings.Join(p.args, " "))
	cmd := exec.Command(p.path, p.args...)
	cmd.Env = p.env
	cmd.Dir = p.dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	if err := cmd.Start(); err != nil {
		out.Close()
		p.t.Fatalf("start %s: %v", p.name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done = cmd, done
	go func() {
		err := cmd.Wait()
		out.Close()
		p.mu.Lock()
		p.exit, p.exitedAt = err, time.Now()
		p.mu.Unlock()
		close(done)
	}()
}

func (p *proc) running() bool {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

func (p *proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		_ = cmd.Process.Signal(sig)
	}
}

// wait waits up to timeout for the process to exit and returns its exit
// error; ok is false when it is still running.
func (p *proc) wait(timeout time.Duration) (exit error, ok bool) {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return nil, true
	}
	select {
	case <-done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.exit, true
	case <-time.After(timeout):
		return nil, false
	}
}

// kill sends SIGKILL and waits until the process is gone.
func (p *proc) kill() {
	p.t.Helper()
	p.signal(syscall.SIGKILL)
	if _, ok := p.wait(10 * time.Second); !ok {
		p.t.Fatalf("%s still running 10s after SIGKILL", p.name)
	}
}

// stop sends SIGTERM and waits for a clean exit.
func (p *proc) stop() {
	p.t.Helper()
	p.signal(syscall.SIGTERM)
	exit, ok := p.wait(30 * time.Second)
	if !ok {
		p.t.Fatalf("%s still running 30s after SIGTERM:\n%s", p.name, p.tail(20))
	}
	if exit != nil {
		p.t.Fatalf("%s exited with %v after SIGTERM:\n%s", p.name, exit, p.tail(20))
	}
}

// exited reports whether the process ended, and how.
func (p *proc) exited() (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return false, nil
	}
	select {
	case <-p.done:
		return true, p.exit
	default:
		return false, nil
	}
}

func (p *proc) tail(n int) string {
	raw, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// httpOK reports whether GET url answers 200, and what it answered.
func httpOK(url string) (bool, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	return resp.StatusCode == http.StatusOK, fmt.Sprintf("%d %s", resp.StatusCode, bytes.TrimSpace(body))
}

// natsNode is one nats-server process with JetStream and its own store.
type natsNode struct {
	name     string
	port     int
	httpPort int
	// clusterPort is 0 for a server that is not in a cluster.
	clusterPort int
	store       string
	p           *proc
}

// startNATS starts a single JetStream server with sync_interval: always.
func startNATS(t testing.TB, name string) *natsNode {
	t.Helper()
	n := newNATSNode(t, name, 0)
	n.configure(t, "", nil)
	n.start(t)
	return n
}

func newNATSNode(t testing.TB, name string, clusterPort int) *natsNode {
	t.Helper()
	return &natsNode{name: name, port: workertest.FreePort(t), httpPort: workertest.FreePort(t), clusterPort: clusterPort, store: t.TempDir()}
}

// configure writes the node's config file and prepares its process. The
// store, ports and routes go on the command line; the file holds what the
// flags cannot say.
func (n *natsNode) configure(t testing.TB, cluster string, routes []string) {
	t.Helper()
	conf := filepath.Join(t.TempDir(), n.name+".conf")
	body := fmt.Sprintf("server_name: %s\njetstream {\n  sync_interval: always\n}\n", n.name)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"-c", conf, "-js", "-sd", n.store, "-a", "127.0.0.1",
		"-p", fmt.Sprint(n.port), "-m", fmt.Sprint(n.httpPort)}
	if n.clusterPort != 0 {
		args = append(args, "--cluster_name", cluster,
			"--cluster", fmt.Sprintf("nats://127.0.0.1:%d", n.clusterPort),
			"--routes", strings.Join(routes, ","))
	}
	n.p = newProc(t, "nats-"+n.name, bins.nats, args, nil)
}

func (n *natsNode) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

// start starts the server and waits until its JetStream is up.
func (n *natsNode) start(t testing.TB) {
	t.Helper()
	n.p.start()
	n.waitHealthy(t, "?js-enabled-only=true")
}

func (n *natsNode) waitHealthy(t testing.TB, query string) time.Duration {
	t.Helper()
	return waitFor(t, "nats "+n.name+" is healthy", 60*time.Second, func() (bool, string) {
		if gone, err := n.p.exited(); gone {
			t.Fatalf("nats %s exited: %v\n%s", n.name, err, n.p.tail(20))
		}
		return httpOK(fmt.Sprintf("http://127.0.0.1:%d/healthz%s", n.httpPort, query))
	})
}

// bus is the test's own client connection, reconnecting forever.
type bus struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	pub *publisher.Publisher
}

func connect(t testing.TB, urls string, opts ...nats.Option) *bus {
	t.Helper()
	nc, err := nats.Connect(urls, append([]nats.Option{
		nats.Name("e2e test"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(50 * time.Millisecond),
		nats.RetryOnFailedConnect(true),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &bus{nc: nc, js: js, pub: publisher.New(js, publisher.WithSource("/steward/e2e"))}
}

// ensureStreams creates the streams, retrying while a cluster elects its
// leaders.
func (b *bus) ensureStreams(t testing.TB, replicas int) {
	t.Helper()
	cfg := events.DefaultStreamConfig()
	cfg.Replicas = replicas
	waitFor(t, fmt.Sprintf("the streams exist with %d replicas", replicas), 60*time.Second, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := events.EnsureStreams(ctx, b.js, cfg); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
}

// publishAcked publishes e until JetStream acknowledges it or the deadline
// passes. The id is fixed first, so a retry after a lost ack is stored once.
// It returns the ack and how many attempts failed.
func (b *bus) publishAcked(ctx context.Context, e event.Event) (publisher.Ack, int, error) {
	failed := 0
	for {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		ack, err := b.pub.Publish(actx, e)
		cancel()
		if err == nil {
			return ack, failed, nil
		}
		if publisher.IsInvalid(err) {
			return ack, failed, err
		}
		failed++
		select {
		case <-ctx.Done():
			return ack, failed, fmt.Errorf("event %s not acknowledged: %w (last error: %v)", e.ID(), ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// streamIDs reads a stream and returns, per event id, the sequences that
// hold it. A cluster whose leaders are moving may refuse a read for a
// moment: that is waited out.
func (b *bus) streamIDs(t testing.TB, stream string, subjects ...string) map[string][]uint64 {
	t.Helper()
	var ids map[string][]uint64
	waitFor(t, "a read of "+stream, time.Minute, func() (bool, string) {
		ids = map[string][]uint64{}
		err := b.each(stream, subjects, func(m jetstream.Msg) error {
			meta, err := m.Metadata()
			if err != nil {
				return err
			}
			id := m.Headers().Get(jetstream.MsgIDHeader)
			if id == "" {
				id = m.Headers().Get("ce-id")
			}
			ids[id] = append(ids[id], meta.Sequence.Stream)
			return nil
		})
		if err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	return ids
}

// each reads a stream's messages on subjects (all when none) as they stand.
func (b *bus) each(stream string, subjects []string, fn func(jetstream.Msg) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return streamread.Each(ctx, b.js, streamread.Range{Stream: stream, Subjects: subjects}, fn)
}

// deadLetters returns a worker instance's dead letters, in order.
func (b *bus) deadLetters(t testing.TB, worker, instance string) []events.DeadLetter {
	t.Helper()
	var out []events.DeadLetter
	waitFor(t, "a read of the dead letters of "+worker+"-"+instance, time.Minute, func() (bool, string) {
		out = nil
		err := b.each(events.StreamDLQ, []string{events.DLQSubject(worker, instance)}, func(m jetstream.Msg) error {
			meta, err := m.Metadata()
			if err != nil {
				return err
			}
			out = append(out, events.ParseDeadLetter(meta.Sequence.Stream, m.Subject(), m.Headers(), m.Data()))
			return nil
		})
		if err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	return out
}

// consumerIdle reports whether a durable consumer has settled everything:
// nothing pending, nothing waiting for an ack.
func (b *bus) consumerIdle(name string) (bool, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := b.js.Consumer(ctx, events.StreamEvents, name)
	if err != nil {
		return false, err.Error()
	}
	info, err := c.Info(ctx)
	if err != nil {
		return false, err.Error()
	}
	return info.NumPending == 0 && info.NumAckPending == 0,
		fmt.Sprintf("pending %d, ack pending %d, redelivered %d, ack floor %d", info.NumPending, info.NumAckPending, info.NumRedelivered, info.AckFloor.Stream)
}

// settled is how many events a durable consumer has settled (acknowledged
// or terminated): those delivered, less those awaiting an ack. It assumes
// the consumer sees every event of the stream.
func (b *bus) settled(name string) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := b.js.Consumer(ctx, events.StreamEvents, name)
	if err != nil {
		return 0, err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.Delivered.Stream - uint64(info.NumAckPending), nil
}

// metric returns the sum of a Prometheus counter's samples whose labels
// include every given label="value" pair, scraped from url.
func metric(url, name string, labels ...string) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		if !slices.ContainsFunc(labels, func(l string) bool { return !strings.Contains(line, l) }) {
			var v float64
			if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err == nil {
				sum += v
			}
		}
	}
	return sum, sc.Err()
}
