package workers

import (
	"cmp"
	"slices"
	"time"
)

// lane is the queue of one order key: events of a key run one at a time in
// stream order. It is plain data, driven by the keyedQueue under its lock and
// tested on its own with a fake clock (lane_test.go).
//
// Two things can hold a lane up:
//   - its head is retrying: it keeps its place (still held and
//     heartbeated, so waiting costs it no delivery) until retryAt, and
//     nothing later of the key overtakes it, except a newer verified event
//     of a latest-wins kind, which supersedes it at once;
//   - an earlier event of the key is held elsewhere (a process that died
//     holding it, or another live process): waitFor names it, and the lane
//     runs nothing later until it is back or waitUntil passes.
type lane struct {
	// name is the lane's, as laneOf names it.
	name    string
	queue   []*held
	running bool

	waitFor   uint64
	waitUntil time.Time

	// wake is signalled when an event joins the lane while its runner
	// waits for a retry, so a latest-wins lane can supersede at once.
	wake chan struct{}
}

func newLane() *lane { return &lane{wake: make(chan struct{}, 1)} }

// insert queues h in stream order.
func (l *lane) insert(h *held) {
	i, _ := slices.BinarySearchFunc(l.queue, h.seq, func(q *held, seq uint64) int { return cmp.Compare(q.seq, seq) })
	l.queue = slices.Insert(l.queue, i, h)
}

// indexOf returns where the event with stream sequence seq is queued, or -1.
func (l *lane) indexOf(seq uint64) int {
	i, ok := slices.BinarySearchFunc(l.queue, seq, func(q *held, seq uint64) int { return cmp.Compare(q.seq, seq) })
	if !ok {
		return -1
	}
	return i
}

// blocked reports whether the lane must not run its head now, because an
// earlier event of its key held elsewhere has not come back yet, or the
// head is parked (keyedQueue.maxFailures).
func (l *lane) blocked() bool {
	if len(l.queue) == 0 {
		return false
	}
	return l.queue[0].parked || (l.waitFor != 0 && l.queue[0].seq > l.waitFor)
}

// ready reports whether a run of settled events (batch.go) goes on
// through what the lane does next, or is recorded first: it goes on when
// the head can be handled now with nothing done before it (it is not
// waiting for a retry or behind an earlier event), and, under a
// latest-wins Spec (latestWins), when the next step is to rank queued
// events, supersede the head or look at the stream for a newer one. None
// of those reads the checkpoint the run has not written yet, and a
// supersede joins the run, so a key's burst of versions is settled with
// one checkpoint write, not one a version (docs/benchmarks.md, "Sites").
func (l *lane) ready(now time.Time, latestWins bool) bool {
	if len(l.queue) == 0 || l.blocked() {
		return false
	}
	if latestWins && (len(l.unranked()) > 0 || l.supersedesNow(now) != nil) {
		return true
	}
	return !l.queue[0].retryAt.After(now)
}

// arrived notes that the event with sequence seq joined the lane: if the
// lane was waiting for it, the wait is over.
func (l *lane) arrived(seq uint64) {
	if l.waitFor != 0 && seq <= l.waitFor {
		l.waitFor = 0
	}
}

// expire ends a wait for an earlier event that has run past its deadline;
// it reports whether the lane may run again.
func (l *lane) expire(now time.Time) bool {
	if l.waitFor != 0 && now.After(l.waitUntil) {
		l.waitFor = 0
		return true
	}
	return false
}

// superseded returns the queued event that supersedes the head under a
// latest-wins Spec, or nil: the newest event in the queue whose verified
// rank is at least the head's. Unranked events (they failed verification,
// or take part in no choice) supersede nothing and are never superseded:
// the handler refuses or applies them in their turn.
func (l *lane) superseded() *held {
	if len(l.queue) < 2 || !l.queue[0].ranked {
		return nil
	}
	head := l.queue[0]
	var winner *held
	for _, q := range l.queue[1:] {
		if q.ranked && q.rank >= head.rank && (winner == nil || q.rank >= winner.rank) {
			winner = q
		}
	}
	return winner
}

// supersedesNow returns the event that supersedes the head now: the one
// superseded names, unless superseding the head failed before (unsettled)
// and its retry time has not come.
func (l *lane) supersedesNow(now time.Time) *held {
	winner := l.superseded()
	if winner == nil || (l.queue[0].unsettled && l.queue[0].retryAt.After(now)) {
		return nil
	}
	return winner
}

// unranked returns the queued events whose rank has not been computed yet.
func (l *lane) unranked() []*held {
	var out []*held
	for _, q := range l.queue {
		if !q.rankDone {
			out = append(out, q)
		}
	}
	return out
}

// pop removes and returns the head.
func (l *lane) pop() *held {
	h := l.queue[0]
	l.queue = l.queue[1:]
	return h
}

// signal wakes a runner waiting on the lane, without blocking.
func (l *lane) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}
