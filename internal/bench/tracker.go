package bench

import (
	"cmp"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// tracker records when each event was published, first handled and
// settled.
type tracker struct {
	prefix string
	// cpuNow reads the CPU time the bench's processes have used (Env.cpu);
	// cpu is what it read when the first event went out.
	cpuNow func() cpuUse
	cpu    cpuUse
	// heap is what this process had allocated, and how many collections
	// it had run, when the first event went out (heapNow).
	heap heapCount
	// published is when the last publish ack came back (Unix ns).
	published atomic.Int64
	sent      []atomic.Int64
	handled   []atomic.Int64
	settled   []atomic.Int64
	// checked is how long each event's decoding and validation took (ns),
	// on the paths that time it (tracker.handleChecked).
	checked []atomic.Int64
	done    atomic.Int64
	all     chan struct{}
}

func newTracker(prefix string, n int, cpuNow func() cpuUse) *tracker {
	return &tracker{prefix: prefix, cpuNow: cpuNow, sent: make([]atomic.Int64, n), handled: make([]atomic.Int64, n),
		settled: make([]atomic.Int64, n), checked: make([]atomic.Int64, n), all: make(chan struct{})}
}

func (t *tracker) index(id string) (int, bool) {
	i, err := strconv.Atoi(strings.TrimPrefix(id, t.prefix))
	return i, err == nil && i >= 0 && i < len(t.handled)
}

// handle notes the first handling of an event: a redelivery is not a
// second one.
func (t *tracker) handle(id string) {
	if i, ok := t.index(id); ok {
		t.handled[i].CompareAndSwap(0, time.Now().UnixNano())
	}
}

// handleChecked is handle for a path that decoded and validated the event
// from start: the moment it is handled ends that timing, so the timing
// never runs past the way to the handler, and the path reads the clock
// and finds the event's place once after its work, as handle does. The
// timing keeps at least a nanosecond, so that a clock too coarse to see
// the work still leaves the event noted as timed.
func (t *tracker) handleChecked(id string, start time.Time) {
	if i, ok := t.index(id); ok {
		now := time.Now()
		t.handled[i].CompareAndSwap(0, now.UnixNano())
		t.checked[i].CompareAndSwap(0, max(int64(now.Sub(start)), 1))
	}
}

// settle notes that an event's ack is confirmed; the run ends when every
// event is.
func (t *tracker) settle(id string) {
	i, ok := t.index(id)
	if ok && t.settled[i].CompareAndSwap(0, time.Now().UnixNano()) && t.done.Add(1) == int64(len(t.settled)) {
		close(t.all)
	}
}

func distribution(lat []time.Duration) Latency {
	slices.Sort(lat)
	n := len(lat)
	return Latency{P50: lat[n*50/100], P99: lat[min(n*99/100, n-1)]}
}

// measure reads the heap and the CPU first: the turn ended when its last
// event settled, and the slices and sorts measure makes are the bench's,
// not the path's (they were 32 bytes an event of every path's heap figure,
// and a sort of the validating paths' timings in their CPU).
func (t *tracker) measure() Measure {
	heap, cpu := heapNow(), t.cpuNow().since(t.cpu)
	n := len(t.sent)
	sent, handler, settled, took := make([]int64, n), make([]time.Duration, n), make([]time.Duration, n), make([]time.Duration, n)
	first, last := t.sent[0].Load(), int64(0)
	for i := range n {
		s, h, d := t.sent[i].Load(), t.handled[i].Load(), t.settled[i].Load()
		sent[i], handler[i], settled[i], took[i] = s, time.Duration(h-s), time.Duration(d-s), time.Duration(t.checked[i].Load())
		first, last = min(first, s), max(last, d)
	}
	// Only the paths that decode and validate time it, and they time
	// every event: one that does not validate never settles, so no
	// measure is taken with an event untimed.
	var checked Latency
	if took[0] != 0 {
		checked = distribution(took)
	}
	// Before distribution sorts handler: bunched pairs it with sent by index.
	bunched := bunched(sent, handler, bunchWindow)
	elapsed, publishing := time.Duration(last-first), time.Duration(t.published.Load()-first)
	return Measure{
		Events: n, Elapsed: elapsed, PerSecond: float64(n) / elapsed.Seconds(),
		Published: float64(n) / publishing.Seconds(),
		Handler:   distribution(handler), Settled: distribution(settled), Checked: checked,
		CPU: cpu.all / time.Duration(n), ServerCPU: cpu.server / time.Duration(n),
		Alloc: (heap.bytes - t.heap.bytes) / uint64(n), Collections: heap.collections - t.heap.collections,
		Bunched: bunched,
	}
}

// bunchWindow is the stretch of publish times Measure.Bunched counts the
// slowest 1% in: at 1,000 events/s, 40 events, the size of the server's
// stalls seen so far.
const bunchWindow = 40 * time.Millisecond

// bunched returns the most of the slowest 1% of the events (at least one;
// lat[i] is event i's latency, sent[i] when it was published) that were
// published within window of each other.
func bunched(sent []int64, lat []time.Duration, window time.Duration) int {
	slowest := make([]int, len(lat))
	for i := range slowest {
		slowest[i] = i
	}
	slices.SortStableFunc(slowest, func(a, b int) int { return cmp.Compare(lat[b], lat[a]) })
	slowest = slowest[:max(len(lat)/100, min(len(lat), 1))]
	at := make([]int64, len(slowest))
	for j, i := range slowest {
		at[j] = sent[i]
	}
	slices.Sort(at)
	most, from := 0, 0
	for to := range at {
		for at[to]-at[from] >= int64(window) {
			from++
		}
		most = max(most, to-from+1)
	}
	return most
}

// heapCount is what the process has allocated on its heap so far, and how
// many garbage collections it has run.
type heapCount struct{ bytes, collections uint64 }

// heapNow reads the heap's counters from runtime/metrics, which, unlike
// runtime.ReadMemStats, does not stop the world, so reading them does not
// itself show in a path's latencies.
func heapNow() heapCount {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}, {Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	return heapCount{bytes: s[0].Value.Uint64(), collections: s[1].Value.Uint64()}
}

// Marks is what an external path's consumer reports (ExternalMain), by the
// event's id, its ce-id header: when the event reached its handler, and when
// its ack was confirmed. Both are safe to call from any goroutine, and a
// second call for the same event is not counted.
type Marks struct{ t *tracker }

// Handled notes that the event reached its handler.
func (m Marks) Handled(id string) { m.t.handle(id) }

// Settled notes that the event's ack is confirmed.
func (m Marks) Settled(id string) { m.t.settle(id) }
