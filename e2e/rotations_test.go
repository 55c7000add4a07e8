package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers/workertest"
)

// The fault tests on the bus (1 to 3) drive e2e/faultworker with
// credential.rotated events: the hive is the key, versions count up.

// applied is one line of the fault worker's apply log (faultworker.Applied).
type applied struct {
	Hive      string `json:"hive"`
	Version   uint64 `json:"version"`
	Seq       uint64 `json:"seq"`
	EventID   string `json:"eventId"`
	Prev      uint64 `json:"prev"`
	Recovered bool   `json:"recovered"`
	Stale     bool   `json:"stale"`
	PID       int    `json:"pid"`
	At        int64  `json:"at"`
}

// hiveState is the fault worker's state file of one hive (faultworker.State).
type hiveState struct {
	Hive     string `json:"hive"`
	Version  uint64 `json:"version"`
	ClientID string `json:"clientId"`
	Seq      uint64 `json:"seq"`
	EventID  string `json:"eventId"`
}

// rotationSecret satisfies the schema; the fault worker never opens it.
const rotationSecret = "-----BEGIN AGE ENCRYPTED FILE-----\nZTJlIGZhdWx0IHRlc3Q=\n-----END AGE ENCRYPTED FILE-----\n"

func hiveName(i int) string { return fmt.Sprintf("h%02d", i) }

func clientID(hive string, version uint64) string {
	return fmt.Sprintf("client-%s-%d", hive, version)
}

// rotation is version v of hive's credential, with an id fixed in advance
// so that a publish retried after a lost ack is stored once.
func rotation(t testing.TB, run, hive string, v uint64) event.Event {
	t.Helper()
	e, err := events.New(events.TypeCredentialRotated, hive, events.CredentialRotated{
		Hive: hive, Version: v, ClientID: clientID(hive, v), Secret: rotationSecret,
	})
	if err != nil {
		t.Fatal(err)
	}
	e.SetID(fmt.Sprintf("%s-%s-%03d", run, hive, v))
	return e
}

// rotations is every version 1..versions of hives keys, round robin: all
// keys' version 1, then all keys' version 2, ...
func rotations(t testing.TB, run string, keys, versions int) []event.Event {
	t.Helper()
	var list []event.Event
	for v := 1; v <= versions; v++ {
		for k := range keys {
			list = append(list, rotation(t, run, hiveName(k), uint64(v)))
		}
	}
	return list
}

// faultWorker is one e2e/faultworker process.
type faultWorker struct {
	*proc
	instance string
	dir      string
	http     string
}

func startFaultWorker(t testing.TB, instance, natsURLs string, replicas int, extra ...string) *faultWorker {
	t.Helper()
	fw := &faultWorker{instance: instance, dir: t.TempDir(), http: fmt.Sprintf("127.0.0.1:%d", workertest.FreePort(t))}
	args := append([]string{
		"--nats-url", natsURLs, "--instance", instance, "--dir", fw.dir, "--http-addr", fw.http,
		"--replicas", fmt.Sprint(replicas), "--ack-wait", "1s",
	}, extra...)
	fw.proc = newProc(t, "faultworker-"+instance, bins.faultworker, args, nil)
	fw.start()
	fw.waitReady(t)
	return fw
}

func (fw *faultWorker) consumer() string { return "fault-" + fw.instance }

func (fw *faultWorker) waitReady(t testing.TB) time.Duration {
	t.Helper()
	return waitFor(t, fw.name+" is ready", 60*time.Second, func() (bool, string) {
		if gone, err := fw.exited(); gone {
			t.Fatalf("%s exited: %v\n%s", fw.name, err, fw.tail(20))
		}
		return httpOK("http://" + fw.http + "/readyz")
	})
}

// log reads the apply log; a line still being written is left for later.
func (fw *faultWorker) log(t testing.TB) []applied {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(fw.dir, "applied.jsonl"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	if i := bytes.LastIndexByte(raw, '\n'); i >= 0 {
		raw = raw[:i+1]
	} else {
		raw = nil
	}
	var out []applied
	for line := range bytes.Lines(raw) {
		var a applied
		if err := json.Unmarshal(line, &a); err != nil {
			t.Fatalf("apply log of %s: line %q: %v", fw.instance, line, err)
		}
		out = append(out, a)
	}
	return out
}

// state reads every hive's state file.
func (fw *faultWorker) state(t testing.TB) map[string]hiveState {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(fw.dir, "state", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]hiveState{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var s hiveState
		if err := json.Unmarshal(raw, &s); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[s.Hive] = s
	}
	return out
}

// verdict is what an apply log says about a run.
type verdict struct {
	applied    int // distinct events applied
	superseded int // events never applied because a later one of their key was
	lost       int // events neither applied nor superseded
	duplicates int // events applied more than once
	backwards  int // applications that moved a key to an older version
	recovered  int // events applied by a killed process and logged by the next
	// stale counts deliveries of an event older than one already applied
	// to its key, which the handler refused to apply.
	stale int
	// examples holds a few of the lines that broke a rule, for the log.
	examples []string
}

// judge checks an apply log against what was published (stream sequence per
// event id).
func judge(log []applied, published map[string]uint64, want []event.Event) verdict {
	var v verdict
	count := map[uint64]int{}
	last := map[string]uint64{}
	example := func(rule string, a applied) {
		if len(v.examples) < 10 {
			v.examples = append(v.examples, fmt.Sprintf("%s: %+v", rule, a))
		}
	}
	for _, a := range log {
		if a.Stale {
			v.stale++
			continue
		}
		count[a.Seq]++
		if a.Recovered {
			v.recovered++
		}
		if count[a.Seq] > 1 {
			example("applied again", a)
		} else if a.Version <= last[a.Hive] {
			v.backwards++
			example(fmt.Sprintf("backwards from version %d", last[a.Hive]), a)
		}
		last[a.Hive] = max(last[a.Hive], a.Version)
	}
	for _, n := range count {
		v.applied++
		if n > 1 {
			v.duplicates += n - 1
		}
	}
	for _, e := range want {
		seq := published[e.ID()]
		if count[seq] > 0 {
			continue
		}
		var data events.CredentialRotated
		_ = json.Unmarshal(e.Data(), &data)
		if last[data.Hive] > data.Version {
			v.superseded++
		} else {
			v.lost++
		}
	}
	return v
}

// checkEndState says how the hives' state differs from every hive at
// version versions (empty when it does not).
func checkEndState(got map[string]hiveState, keys int, versions uint64) []string {
	var diffs []string
	for k := range keys {
		h := hiveName(k)
		s, ok := got[h]
		switch {
		case !ok:
			diffs = append(diffs, h+": no state")
		case s.Version != versions || s.ClientID != clientID(h, versions):
			diffs = append(diffs, fmt.Sprintf("%s: version %d client %s", h, s.Version, s.ClientID))
		}
	}
	if len(got) != keys {
		diffs = append(diffs, fmt.Sprintf("%d hives in state, want %d", len(got), keys))
	}
	return diffs
}

// publisherRun publishes a list of events in order from a goroutine,
// retrying each until acknowledged, and records the acks.
type publisherRun struct {
	mu       sync.Mutex
	acked    map[string]uint64
	ackedAt  []time.Time
	failures int
	// dups counts acks for an event JetStream already held: a retry
	// after a lost ack, stored once thanks to the event id.
	dups int
	err  error
	done chan struct{}
}

func publishAll(ctx context.Context, b *bus, list []event.Event) *publisherRun {
	r := &publisherRun{acked: map[string]uint64{}, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for _, e := range list {
			ack, failed, err := b.publishAcked(ctx, e)
			r.mu.Lock()
			r.failures += failed
			if err != nil {
				r.err = err
				r.mu.Unlock()
				return
			}
			if ack.Duplicate {
				r.dups++
			}
			r.acked[e.ID()] = ack.Sequence
			r.ackedAt = append(r.ackedAt, time.Now())
			r.mu.Unlock()
		}
	}()
	return r
}

// ackedAfter reports whether an ack came after t0, and how long after.
func (r *publisherRun) ackedAfter(t0 time.Time) (time.Duration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, at := range r.ackedAt {
		if at.After(t0) {
			return at.Sub(t0), true
		}
	}
	return 0, false
}

func (r *publisherRun) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.acked)
}

// wait waits for the publisher to finish and fails the test if it could
// not publish everything.
func (r *publisherRun) wait(t testing.TB, timeout time.Duration) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(timeout):
		t.Fatalf("publisher not done after %v (%d acked)", timeout, r.count())
	}
	if r.err != nil {
		t.Fatalf("publisher: %v", r.err)
	}
}

// lostAcked counts the acknowledged events the stream does not hold, and
// the events it holds more than once.
func lostAcked(acked map[string]uint64, stored map[string][]uint64) (lost, dupStored int) {
	for id := range acked {
		if len(stored[id]) == 0 {
			lost++
		}
	}
	for _, seqs := range stored {
		if len(seqs) > 1 {
			dupStored += len(seqs) - 1
		}
	}
	return lost, dupStored
}

// durations summarises recovery times.
type durations []time.Duration

func (d durations) max() time.Duration {
	if len(d) == 0 {
		return 0
	}
	return slices.Max(d)
}

func (d durations) mean() time.Duration {
	if len(d) == 0 {
		return 0
	}
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return sum / time.Duration(len(d))
}

func (d durations) String() string {
	parts := make([]string, len(d))
	for i, x := range d {
		parts[i] = x.Round(time.Millisecond).String()
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// randomPoints draws n distinct sorted integers in [lo, hi].
func randomPoints(intn func(int) int, n, lo, hi int) []int {
	seen := map[int]bool{}
	for len(seen) < n && len(seen) < hi-lo+1 {
		seen[lo+intn(hi-lo+1)] = true
	}
	out := make([]int, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	sort.Ints(out)
	return out
}

// round keeps figures readable.
func round(d time.Duration) time.Duration { return d.Round(time.Millisecond) }

// rate is events per second over d.
func rate(events int, d time.Duration) string {
	return fmt.Sprintf("%.0f/s", float64(events)/d.Seconds())
}

// hivesOf returns the hives the examples name.
func hivesOf(examples []string) []string {
	var out []string
	for _, e := range examples {
		if i := strings.Index(e, "Hive:"); i >= 0 {
			h := strings.Fields(e[i+5:])[0]
			if !slices.Contains(out, h) {
				out = append(out, h)
			}
		}
	}
	return out
}
