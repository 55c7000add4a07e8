package workers

import (
	"time"
)

// maxBatch bounds how many events of one lane a single checkpoint write
// records: a lane with a long queue gives up its concurrency slot this
// often, so the other keys get their turn. maxBatchAge bounds how long the
// first of them waits to be recorded, counted from when its handler
// started: with slow handlers (a migration that takes minutes) a run is one
// event, so a crash never leaves a long run of finished work to do again.
const (
	maxBatch    = 64
	maxBatchAge = 100 * time.Millisecond
)

// batch is a run of one lane's events the handler has settled (applied or
// refused) on the fast path, one after the other, whose checkpoint is not
// written yet. One compare-and-swap records them all (the checkpoint moves
// to the last one, which covers the earlier ones of the key), and then
// they are acked: the checkpoint is still written before any ack, and a
// crash before the write means the run is redelivered and handled again,
// as a crash between a handler and its checkpoint always meant for one
// event (handlers are idempotent).
//
// The batch is only ever the lane's next step: the lane flushes it before
// anything else it does (a retry, a wait, a dead letter, a supersede, an
// order check that found an earlier event elsewhere, stopping), so those
// see the checkpoint as if every event of the run had been recorded on
// its own.
type batch struct {
	lane *lane
	// events are the run's, each with its result in held.handled.
	events []*held
	// since is when the handler of the run's first event started.
	since time.Time
	// cp and rev are the lane's checkpoint as last read or written (the
	// run's own stage saves included), which the write replaces.
	cp  checkpoint
	rev uint64
}

func (b *batch) empty() bool { return len(b.events) == 0 }

// full reports whether the run must be recorded before it grows: it holds
// maxBatch events, or its first has waited maxBatchAge.
func (b *batch) full(now time.Time) bool {
	return len(b.events) >= maxBatch || now.Sub(b.since) >= maxBatchAge
}

// holds reports whether h is the run's last event: it was just settled
// into it.
func (b *batch) holds(h *held) bool { return !b.empty() && b.events[len(b.events)-1] == h }

// starting notes that an event is about to be handled at now: the first
// of a run sets its age.
func (b *batch) starting(now time.Time) {
	if b.empty() {
		b.since = now
	}
}

// add records that h is settled with result, its handler having seen the
// lane's checkpoint as cp at revision rev (or moved it there). The result
// is h.handled from now on: should the write fail, recording h again does
// not run its handler again.
func (b *batch) add(h *held, result string, cp checkpoint, rev uint64) {
	h.handled = result
	b.events = append(b.events, h)
	b.cp, b.rev = cp, rev
}

// view is the lane's checkpoint as the next event must see it: every event
// of the run counts as settled, although the bucket does not say so yet.
// ok is false when the run is empty.
func (b *batch) view() (cp checkpoint, rev uint64, ok bool) {
	if b.empty() {
		return checkpoint{}, 0, false
	}
	last := b.events[len(b.events)-1]
	cp = b.cp
	// A superseded event joins the run even when another process has
	// already moved the key past it (settle then writes nothing): the
	// view never moves the checkpoint back.
	if last.seq > cp.Applied {
		cp.Applied, cp.EventID = last.seq, last.event.ID()
	}
	return cp, b.rev, true
}

// flush records the run: the settler writes its checkpoint and acks its
// events. When the write fails, each event is put back in its place to be
// recorded again later without running its handler again (held.handled),
// after its backoff.
//
// It returns the write's error: nothing of the run is acked then.
func (w *Runtime) flush(b *batch) error {
	if b.empty() {
		return nil
	}
	err := w.settler.recordRun(b)
	if err != nil {
		for _, h := range b.events {
			// A superseded one is superseded again after its backoff,
			// like the others are recorded again, not at once.
			h.unsettled = h.handled == resultSuperseded
			w.retry(b.lane, h, err)
		}
	} else {
		for _, h := range b.events {
			w.unhold(h)
		}
	}
	// The confirmation goroutine keeps the run's slice: start a new one.
	b.events = nil
	return err
}
