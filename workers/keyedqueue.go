package workers

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/redact"
)

// keyedQueue is every message the worker holds, queued by order key: one
// lane per key, whose events run one at a time in stream order. It decides
// what a lane does next (run its head, wait for a retry, rank, supersede,
// record its run of settled events, or stop) under a lock of its own, and
// the lane's runner does it outside that lock: handlers, checkpoint writes
// and stream reads never hold it. It reads no server, so it is tested with
// a fake clock alone (keyedqueue_test.go).
type keyedQueue struct {
	mu    sync.Mutex
	lanes map[string]*lane
	// held is every message the worker holds (queued, waiting or running),
	// by stream sequence, so a redelivery of one is recognised at once.
	held map[uint64]*held

	// latestWins says the Spec ranks its events (Spec.Rank).
	latestWins bool
	now        func() time.Time
	newBackoff func() backoff.BackOff
	// stopping is the worker's: once set, no lane is claimed and runners
	// end their lanes.
	stopping *atomic.Bool
	// tasks counts the lanes claimed and not ended (and the worker's other
	// tasks): a claim adds to it under the lock, so shutdown, which stops
	// the claims first, never waits on a count that is about to grow.
	tasks *sync.WaitGroup
	// maxFailures, when above 0, parks an event once its handler has
	// failed that many times (panics apart, WithMaxPanics bounds those):
	// it keeps its place and holds its key, and is never tried again. Only
	// an engine in memory sets it (workertest's WithAttempts), where a
	// failure retried for as long as it lasts would never let a test end;
	// a worker retries desired state until it applies.
	maxFailures uint64
	// inRounds, set only by an engine in memory, ends a lane's run when
	// its head waits for a retry, rather than waiting on the clock:
	// dueInRound starts it again once every other lane has run, as a
	// worker's other lanes run while one waits out its backoff.
	inRounds bool
}

func newKeyedQueue(latestWins bool, now func() time.Time, newBackoff func() backoff.BackOff, stopping *atomic.Bool, tasks *sync.WaitGroup) *keyedQueue {
	return &keyedQueue{
		lanes: map[string]*lane{}, held: map[uint64]*held{},
		latestWins: latestWins, now: now, newBackoff: newBackoff, stopping: stopping, tasks: tasks,
	}
}

// hold records h as held outside any lane: an event that does not decode
// has no key and goes straight to the DLQ.
func (q *keyedQueue) hold(h *held) {
	q.mu.Lock()
	q.held[h.seq] = h
	q.mu.Unlock()
}

// unhold forgets h, once it is settled or handed back; it reports whether h
// was still held.
func (q *keyedQueue) unhold(h *held) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if cur, ok := q.held[h.seq]; ok && cur == h {
		delete(q.held, h.seq)
		return true
	}
	return false
}

// add queues h behind its key. A redelivery of an event still queued here
// takes its place, keeping what this process knows of the event; one of an
// event whose handler runs is dropped (the running one decides). added
// says h is newly held; claimed is its lane when that now needs a runner,
// which the caller must start (runLane).
func (q *keyedQueue) add(h *held) (added bool, claimed *lane) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if prev, ok := q.held[h.seq]; ok {
		if l := q.lanes[prev.lane]; l != nil {
			if i := l.indexOf(h.seq); i >= 0 && l.queue[i] == prev {
				h.attempts, h.panics, h.backoff, h.retryAt = prev.attempts, prev.panics, prev.backoff, prev.retryAt
				h.firstFailure, h.lastError = prev.firstFailure, prev.lastError
				h.rank, h.ranked, h.rankDone = prev.rank, prev.ranked, prev.rankDone
				h.handled = prev.handled
				l.queue[i] = h
				q.held[h.seq] = h
			}
		}
		return false, nil
	}
	l := q.lanes[h.lane]
	if l == nil {
		l = newLane()
		l.name = h.lane
		q.lanes[h.lane] = l
	}
	q.held[h.seq] = h
	l.insert(h)
	l.arrived(h.seq)
	l.signal()
	if q.claim(l) {
		return true, l
	}
	return true, nil
}

// claim marks a lane that has work and no runner as running. Callers hold
// q.mu.
func (q *keyedQueue) claim(l *lane) bool {
	if l.running || len(l.queue) == 0 || q.stopping.Load() {
		return false
	}
	l.running = true
	q.tasks.Add(1)
	return true
}

// stepKind is what a lane's runner does next.
type stepKind int

const (
	// stepDone: nothing the lane may run now (it is empty, held up by an
	// earlier event held elsewhere, or the worker stops); its runner ends.
	stepDone stepKind = iota
	// stepFlush: record the lane's run of settled events first (batch.go).
	stepFlush
	// stepRank: ask the Spec's Rank for the place of step.todo.
	stepRank
	// stepSupersede: step.h, taken off the lane, is superseded by
	// step.winner, queued behind it.
	stepSupersede
	// stepCheckNewer: look at the stream for an event newer than the
	// head, step.h, before its attempt; takeHead takes it if one is found.
	stepCheckNewer
	// stepWait: the head waits step.wait for its retry.
	stepWait
	// stepRun: handle step.h, taken off the lane.
	stepRun
)

// step is what next decided for a lane.
type step struct {
	kind   stepKind
	h      *held
	winner *held
	todo   []*held
	wait   time.Duration
}

// next decides what the runner of l, whose unrecorded run of settled events
// is b, does next. A run is recorded before anything else the lane does
// once it is full, the worker stops, or the head cannot run at once, so
// whatever follows sees the checkpoint as if each event had been recorded
// on its own. A lane that ends with nothing queued and nothing to wait for
// is forgotten.
func (q *keyedQueue) next(l *lane, b *batch) step {
	q.mu.Lock()
	defer q.mu.Unlock()
	if now := q.now(); !b.empty() && (b.full(now) || q.stopping.Load() || !l.ready(now, q.latestWins)) {
		return step{kind: stepFlush}
	}
	if q.stopping.Load() || len(l.queue) == 0 || l.blocked() {
		l.running = false
		if len(l.queue) == 0 && l.waitFor == 0 {
			delete(q.lanes, l.name)
		}
		return step{kind: stepDone}
	}
	if q.latestWins {
		if todo := l.unranked(); len(todo) > 0 {
			return step{kind: stepRank, todo: todo}
		}
		if winner := l.supersedesNow(q.now()); winner != nil {
			return step{kind: stepSupersede, h: l.pop(), winner: winner}
		}
		if head := l.queue[0]; head.ranked && head.checkedAt <= head.attempts && !head.retryAt.After(q.now()) {
			// Before each attempt, a newer event stored for the key (not
			// received here yet, or held elsewhere) wins too.
			head.checkedAt = head.attempts + 1
			return step{kind: stepCheckNewer, h: head}
		}
	}
	if wait := l.queue[0].retryAt.Sub(q.now()); wait > 0 {
		if q.inRounds {
			l.running = false
			return step{kind: stepDone}
		}
		return step{kind: stepWait, wait: wait}
	}
	return step{kind: stepRun, h: l.pop()}
}

// trust marks the events held at seqs as validated, so that neither
// their lanes nor Rank check them: an engine in memory hands a test's
// handler data the runtime would refuse (workertest.Unchecked).
func (q *keyedQueue) trust(seqs []uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, seq := range seqs {
		if h := q.held[seq]; h != nil {
			h.validated = true
		}
	}
}

// dueInRound makes every lane whose head waits for a retry (and is not
// parked) due now, and claims it: the next round of an engine in memory
// (inRounds). The caller runs what it returns.
func (q *keyedQueue) dueInRound() []*lane {
	q.mu.Lock()
	defer q.mu.Unlock()
	var claimed []*lane
	now := q.now()
	for _, l := range q.lanes {
		if len(l.queue) == 0 || l.running || l.blocked() || !l.queue[0].retryAt.After(now) {
			continue
		}
		l.queue[0].retryAt = now
		if q.claim(l) {
			claimed = append(claimed, l)
		}
	}
	return claimed
}

// takeHead takes h off l when it is still the head (a stream read found it
// superseded, and nothing took its place meanwhile).
func (q *keyedQueue) takeHead(l *lane, h *held) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(l.queue) == 0 || l.queue[0] != h {
		return false
	}
	l.pop()
	return true
}

// retry puts h back at its place in l to be tried again after the next
// interval of its backoff; err (nil for a settling step that failed) is
// what the status document shows. It reports whether this was h's first
// failure, when its key starts being listed as retrying.
func (q *keyedQueue) retry(l *lane, h *held, err error) (first bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	if h.backoff == nil {
		h.backoff = q.newBackoff()
		h.firstFailure = now
	}
	h.attempts++
	if err != nil {
		h.lastError = redact.Line(err.Error())
	}
	delay := h.backoff.NextBackOff()
	if delay == backoff.Stop || delay < 0 {
		delay = 0
	}
	h.retryAt = now.Add(delay)
	h.parked = q.maxFailures > 0 && h.attempts-uint64(h.panics) >= q.maxFailures
	l.insert(h)
	return h.attempts == 1
}

// waitBehind puts h back in l, still held (and heartbeated, so waiting
// costs no delivery), behind the earlier event at sequence behind that is
// held elsewhere: when h is the head, l runs nothing until that event comes
// back or recheck has passed and the order is looked at again (the earlier
// event may settle elsewhere without coming back here).
func (q *keyedQueue) waitBehind(l *lane, h *held, behind uint64, recheck time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	l.insert(h)
	if l.queue[0] == h {
		l.waitFor = behind
		l.waitUntil = q.now().Add(recheck)
	}
}

// rankResult is what ranking one event found: it failed validation
// (invalid), or its rank (ok false: it does not verify, or takes part in no
// choice).
type rankResult struct {
	invalid error
	rank    uint64
	ok      bool
}

// ranked records the ranks of todo, which are still queued (where a
// redelivery reads them).
func (q *keyedQueue) ranked(todo []*held, results []rankResult) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, h := range todo {
		if h.setValidity(results[i].invalid); !h.invalid {
			h.rank, h.ranked, h.rankDone = results[i].rank, results[i].ok, true
		}
	}
}

// releaseAll empties every lane and returns what was queued (those waiting
// for a retry included), for a stopping worker to hand back; lanes with no
// runner are forgotten.
func (q *keyedQueue) releaseAll() []*held {
	q.mu.Lock()
	defer q.mu.Unlock()
	var queued []*held
	for name, l := range q.lanes {
		queued = append(queued, l.queue...)
		l.queue = nil
		if !l.running {
			delete(q.lanes, name)
		}
	}
	return queued
}

// tick is the heartbeat's look at the queue: the messages held, to mark in
// progress, and the lanes whose wait for an earlier event ran out and that
// now need a runner (claimed, for the caller to start).
func (q *keyedQueue) tick() (msgs []jetstream.Msg, claimed []*lane, now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	msgs = make([]jetstream.Msg, 0, len(q.held))
	for _, h := range q.held {
		msgs = append(msgs, h.msg)
	}
	now = q.now()
	for _, l := range q.lanes {
		if l.expire(now) && q.claim(l) {
			claimed = append(claimed, l)
		}
	}
	return msgs, claimed, now
}

// status is what the status document says of the queue: the events being
// retried and the keys waiting for an earlier event, by sequence, and when
// the oldest event held was received (zero: none is).
func (q *keyedQueue) status() (retrying []events.RetryingKey, waiting []events.WaitingKey, oldest time.Time) {
	retrying, waiting = []events.RetryingKey{}, []events.WaitingKey{}
	q.mu.Lock()
	for _, h := range q.held {
		if h.attempts > 0 {
			retrying = append(retrying, events.RetryingKey{
				Key: h.key, EventID: h.event.ID(), Sequence: h.seq, Attempt: h.attempts,
				FirstFailure: h.firstFailure.UTC(), NextAttempt: h.retryAt.UTC(), LastError: h.lastError,
			})
		}
		if oldest.IsZero() || h.received.Before(oldest) {
			oldest = h.received
		}
	}
	for _, l := range q.lanes {
		if l.waitFor != 0 && len(l.queue) > 0 {
			h := l.queue[0]
			waiting = append(waiting, events.WaitingKey{Key: h.key, EventID: h.event.ID(), Sequence: h.seq, Behind: l.waitFor, Since: h.deferredSince.UTC()})
		}
	}
	q.mu.Unlock()
	slices.SortFunc(retrying, func(a, b events.RetryingKey) int { return int(a.Sequence) - int(b.Sequence) })
	slices.SortFunc(waiting, func(a, b events.WaitingKey) int { return int(a.Sequence) - int(b.Sequence) })
	return retrying, waiting, oldest
}
