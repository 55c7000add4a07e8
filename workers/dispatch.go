package workers

import (
	"time"
)

// laneRun is what runs l, which the queue has claimed: the caller runs it or
// hands it to a runner.
func (w *Runtime) laneRun(l *lane) func() { return func() { w.runLane(l) } }

// runLane handles a lane's events one at a time until it is empty, held up
// by an earlier event held elsewhere, or the worker stops, doing what the
// queue decides next (keyedQueue.next). A retrying head keeps its place
// while it waits (without a concurrency slot); under a latest-wins Spec, a
// newer verified event that joins the lane meanwhile supersedes it at once.
//
// Events the handler settles one after the other, and those a newer one of
// their key supersedes, form a run (batch.go):
// the lane keeps its concurrency slot while it has one, and records the
// run with one checkpoint write before it does anything else, when the run
// is full (64 events, or 100ms since its first handler started), or when
// nothing more of the key is queued.
func (w *Runtime) runLane(l *lane) {
	defer w.tasks.Done()
	b := &batch{lane: l}
	slot := false
	freeSlot := func() {
		if slot {
			<-w.sem
			slot = false
		}
	}
	for {
		s := w.queue.next(l, b)
		switch s.kind {
		case stepDone:
			return
		case stepFlush:
			w.flush(b)
			freeSlot()
		case stepRank:
			w.rankAll(s.todo)
		case stepSupersede:
			w.settleSuperseded(l, s.h, s.winner.event.ID(), s.winner.seq, b)
		case stepCheckNewer:
			if id, seq, ok := w.newerStored(w.handlerCtx, s.h); ok && w.queue.takeHead(l, s.h) {
				w.settleSuperseded(l, s.h, id, seq, b)
			}
		case stepWait:
			w.waitRetry(l, s.wait)
		case stepRun:
			if !slot {
				select {
				case w.sem <- struct{}{}:
					slot = true
				case <-w.handlerCtx.Done():
					w.settler.release(s.h)
					w.unhold(s.h)
					continue
				}
			}
			w.runHead(l, s.h, b)
			if b.empty() {
				freeSlot()
			}
		}
	}
}

// runHead processes h, the lane's head, and does what its verdict says.
func (w *Runtime) runHead(l *lane, h *held, b *batch) {
	v := w.process(h, b)
	switch {
	case v.batched:
		// Recorded, acked and unheld with its run.
	case v.behind != 0:
		// Looked at again every heartbeat: the earlier event may settle
		// elsewhere (applied, or dead-lettered by another process)
		// without coming back here.
		w.queue.waitBehind(l, h, v.behind, w.o.heartbeat)
	case v.retry != nil:
		w.retry(l, h, v.retry)
	default:
		w.unhold(h)
	}
}

// settleSuperseded settles h as superseded with the lane's run b, or puts
// it back to be superseded again after its backoff when its outcome could
// not be published or its checkpoint read.
func (w *Runtime) settleSuperseded(l *lane, h *held, byID string, bySeq uint64, b *batch) {
	if err := w.settler.supersede(h, byID, bySeq, b); err != nil {
		h.unsettled = true
		w.retry(l, h, err)
		return
	}
	h.unsettled = false
}

// waitRetry waits for the head's retry time, a newer event of the key, or
// the worker stopping, whichever comes first.
func (w *Runtime) waitRetry(l *lane, wait time.Duration) {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-l.wake:
	case <-w.stop:
	}
}

// retry puts h back in l to be tried again after its backoff (keyedQueue.retry);
// a key that starts retrying has the status document written at once.
func (w *Runtime) retry(l *lane, h *held, err error) {
	if w.queue.retry(l, h, err) {
		w.statusChanged()
	}
}

// rankAll asks the Spec's Rank for each event's place in its key's order,
// outside the lock (it verifies signatures); an event that does not verify
// is unranked and supersedes nothing.
func (w *Runtime) rankAll(todo []*held) {
	results := make([]rankResult, len(todo))
	for i, h := range todo {
		// Validated first: an invalid event ranks nowhere. What is
		// found is recorded in the queue, with the ranks, since the
		// events are still queued, where a redelivery reads them.
		if !h.validated {
			if err := w.check(h.msg.Subject(), h.event); err != nil {
				results[i].invalid = err
				continue
			}
		}
		d := w.delivery(h, checkpoint{}, 0, w.logFor(h))
		r, err := w.spec.Rank(w.handlerCtx, d)
		results[i].rank, results[i].ok = r, err == nil
	}
	w.queue.ranked(todo, results)
}

// unhold forgets h once it is settled or handed back.
func (w *Runtime) unhold(h *held) {
	if w.queue.unhold(h) {
		w.m.inFlight.Dec()
		if h.attempts > 0 {
			w.statusChanged()
		}
	}
}

// releaseQueued naks every queued event that has not started (those
// waiting for a retry included), so that a stopping worker hands them back
// for immediate redelivery.
func (w *Runtime) releaseQueued() {
	for _, h := range w.queue.releaseAll() {
		w.settler.release(h)
		w.unhold(h)
	}
}
