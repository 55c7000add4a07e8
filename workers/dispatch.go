package workers

import (
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/steward-dev/steward/internal/redact"
)

// startLane runs a lane that has work and no runner on a runner. Callers
// hold w.mu.
func (w *Runtime) startLane(name string, l *lane) {
	if run := w.claimLane(name, l); run != nil {
		w.runners.run(run)
	}
}

// claimLane marks a lane that has work and no runner as running and
// returns what runs it, which the caller must run or hand to a runner;
// otherwise nil. Callers hold w.mu.
func (w *Runtime) claimLane(name string, l *lane) (run func()) {
	if l.running || len(l.queue) == 0 || w.stopping.Load() {
		return nil
	}
	l.running = true
	w.tasks.Add(1)
	return func() { w.runLane(name, l) }
}

// runLane handles a lane's events one at a time until it is empty, held up
// by an earlier event held elsewhere, or the worker stops. A retrying head
// keeps its place while it waits (without a concurrency slot); under a
// latest-wins Spec, a newer verified event that joins the lane meanwhile
// supersedes it at once.
//
// Events the handler settles one after the other form a run (batch.go):
// the lane keeps its concurrency slot while it has one, and records the
// run with one checkpoint write before it does anything else, when the run
// is full (64 events, or 100ms since its first handler started), or when nothing
// more of the key is queued.
func (w *Runtime) runLane(name string, l *lane) {
	defer w.tasks.Done()
	b := &batch{lane: l}
	slot := false
	settleRun := func() {
		w.flush(b)
		if slot {
			<-w.sem
			slot = false
		}
	}
	for {
		w.mu.Lock()
		if now := w.now(); !b.empty() && (b.full(now) || w.stopping.Load() || !l.ready(now, w.spec.Rank != nil)) {
			w.mu.Unlock()
			settleRun()
			continue
		}
		if w.stopping.Load() || len(l.queue) == 0 || l.blocked() {
			l.running = false
			if len(l.queue) == 0 && l.waitFor == 0 {
				delete(w.lanes, name)
			}
			w.mu.Unlock()
			return
		}
		if w.spec.Rank != nil {
			if todo := l.unranked(); len(todo) > 0 {
				w.mu.Unlock()
				w.rankAll(todo)
				continue
			}
			if winner := l.superseded(); winner != nil {
				h := l.pop()
				w.mu.Unlock()
				w.settleSuperseded(l, h, winner.event.ID(), winner.seq)
				continue
			}
			if head := l.queue[0]; head.ranked && head.checkedAt <= head.attempts && !head.retryAt.After(w.now()) {
				// Before each attempt, a newer event stored for the key
				// (not received here yet, or held elsewhere) wins too.
				head.checkedAt = head.attempts + 1
				w.mu.Unlock()
				id, seq, ok := w.newerStored(w.handlerCtx, head)
				if !ok {
					continue
				}
				w.mu.Lock()
				if len(l.queue) == 0 || l.queue[0] != head {
					w.mu.Unlock()
					continue
				}
				l.pop()
				w.mu.Unlock()
				w.settleSuperseded(l, head, id, seq)
				continue
			}
		}
		if wait := l.queue[0].retryAt.Sub(w.now()); wait > 0 {
			w.mu.Unlock()
			w.waitRetry(l, wait)
			continue
		}
		h := l.pop()
		w.mu.Unlock()

		if !slot {
			select {
			case w.sem <- struct{}{}:
				slot = true
			case <-w.handlerCtx.Done():
				w.release(h)
				w.unhold(h)
				continue
			}
		}
		v := w.process(h, b)
		switch {
		case v.batched:
			// Recorded, acked and unheld with its run.
		case v.behind != 0:
			// Still held, and heartbeated, so waiting costs no delivery:
			// back in the queue until the earlier event comes back or
			// the wait runs out and the order is checked again.
			w.mu.Lock()
			l.insert(h)
			if l.queue[0] == h {
				// Looked at again every heartbeat: the earlier event
				// may settle elsewhere (applied, or dead-lettered by
				// another process) without coming back here.
				l.waitFor = v.behind
				l.waitUntil = w.now().Add(w.o.heartbeat)
			}
			w.mu.Unlock()
		case v.retry != nil:
			w.requeue(l, h, v.retry)
		default:
			w.unhold(h)
		}
		if b.empty() && slot {
			<-w.sem
			slot = false
		}
	}
}

// settleSuperseded settles h as superseded, or puts it back to be tried
// again when the settling could not be recorded.
func (w *Runtime) settleSuperseded(l *lane, h *held, byID string, bySeq uint64) {
	if !w.supersede(h, byID, bySeq) {
		w.requeue(l, h, nil)
		return
	}
	w.unhold(h)
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

// requeue puts h back at its place in the lane to be tried again after the
// next interval of its backoff; err (nil for a settling step that failed)
// is what the status document shows.
func (w *Runtime) requeue(l *lane, h *held, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.now()
	if h.backoff == nil {
		h.backoff = w.o.newBackoff()
		h.firstFailure = now
	}
	if h.attempts++; h.attempts == 1 {
		w.statusChanged()
	}
	if err != nil {
		h.lastError = redact.Line(err.Error())
	}
	delay := h.backoff.NextBackOff()
	if delay == backoff.Stop || delay < 0 {
		delay = 0
	}
	h.retryAt = now.Add(delay)
	l.insert(h)
}

// rankAll asks the Spec's Rank for each event's place in its key's order,
// outside the lock (it verifies signatures); an event that does not verify
// is unranked and supersedes nothing.
func (w *Runtime) rankAll(todo []*held) {
	type ranked struct {
		invalid error
		rank    uint64
		ok      bool
	}
	results := make([]ranked, len(todo))
	for i, h := range todo {
		// Validated first: an invalid event ranks nowhere. What is
		// found is recorded under the lock, with the ranks, since the
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
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, h := range todo {
		if h.setValidity(results[i].invalid); !h.invalid {
			h.rank, h.ranked, h.rankDone = results[i].rank, results[i].ok, true
		}
	}
}

func (w *Runtime) hold(h *held) {
	w.mu.Lock()
	w.held[h.seq] = h
	w.mu.Unlock()
	w.m.inFlight.Inc()
}

func (w *Runtime) unhold(h *held) {
	w.mu.Lock()
	cur, ok := w.held[h.seq]
	if ok && cur == h {
		delete(w.held, h.seq)
	}
	w.mu.Unlock()
	if ok && cur == h {
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
	w.mu.Lock()
	var queued []*held
	for name, l := range w.lanes {
		queued = append(queued, l.queue...)
		l.queue = nil
		if !l.running {
			delete(w.lanes, name)
		}
	}
	w.mu.Unlock()
	for _, h := range queued {
		w.release(h)
		w.unhold(h)
	}
}

func (w *Runtime) release(h *held) {
	if err := h.msg.Nak(); err != nil {
		w.log.Debug().Err(err).Uint64("seq", h.seq).Msg("nak at shutdown failed; the event is redelivered after AckWait")
	}
	w.m.count(resultReleased)
}
