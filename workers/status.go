package workers

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/steward-dev/steward/events"
)

// snapshot is the worker's current status, keys in order.
func (w *Runtime) snapshot() events.Status {
	st := events.Status{Worker: w.spec.Name, Instance: w.spec.Instance, Process: processName(), UpdatedAt: w.now().UTC(),
		Retrying: []events.RetryingKey{}, Waiting: []events.WaitingKey{}}
	st.Forged, st.Forgeries = w.forged.snapshot()
	w.mu.Lock()
	for _, h := range w.held {
		if h.attempts > 0 {
			st.Retrying = append(st.Retrying, events.RetryingKey{
				Key: h.key, EventID: h.event.ID(), Sequence: h.seq, Attempt: h.attempts,
				FirstFailure: h.firstFailure.UTC(), NextAttempt: h.retryAt.UTC(), LastError: h.lastError,
			})
		}
	}
	for _, l := range w.lanes {
		if l.waitFor != 0 && len(l.queue) > 0 {
			h := l.queue[0]
			st.Waiting = append(st.Waiting, events.WaitingKey{Key: h.key, EventID: h.event.ID(), Sequence: h.seq, Behind: l.waitFor, Since: h.deferredSince.UTC()})
		}
	}
	w.mu.Unlock()
	slices.SortFunc(st.Retrying, func(a, b events.RetryingKey) int { return int(a.Sequence) - int(b.Sequence) })
	slices.SortFunc(st.Waiting, func(a, b events.WaitingKey) int { return int(a.Sequence) - int(b.Sequence) })
	return st
}

// publishStatus writes the status document when it says something new, and
// the gauges every time. The last one, at shutdown, says the process
// stopped.
func (w *Runtime) publishStatus(final bool) {
	st := w.snapshot()
	st.Stopped = final
	w.m.retrying.Set(float64(len(st.Retrying)))
	w.m.waiting.Set(float64(len(st.Waiting)))
	oldest := 0.0
	for _, r := range st.Retrying {
		oldest = max(oldest, w.now().Sub(r.FirstFailure).Seconds())
	}
	w.m.oldestRetry.Set(oldest)
	w.m.oldestHeld.Set(w.oldestHeld())

	body := st
	body.UpdatedAt = time.Time{}
	raw, _ := json.Marshal(body)
	if bytes.Equal(raw, w.lastStatus) {
		return
	}
	if w.lastStatus == nil && len(st.Retrying) == 0 && len(st.Waiting) == 0 && len(st.Forged) == 0 {
		// Nothing has ever been stuck here: no document, no write.
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := w.store.Set(ctx, events.StatusKey(w.spec.Name, w.spec.Instance), st); err != nil {
		w.log.Debug().Err(err).Msg("status document not written; trying again at the next interval")
		return
	}
	w.lastStatus = raw
}

// statusChanged has the status document written at once, not at the next
// interval: a key started or stopped retrying, and status must say so
// while it is true (it used to list a settled key as retrying for up to
// five seconds).
func (w *Runtime) statusChanged() {
	select {
	case w.statusNow <- struct{}{}:
	default:
	}
}

func processName() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

// oldestHeld is the age in seconds of the oldest event held unsettled.
func (w *Runtime) oldestHeld() float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	var oldest time.Time
	for _, h := range w.held {
		if oldest.IsZero() || h.received.Before(oldest) {
			oldest = h.received
		}
	}
	if oldest.IsZero() {
		return 0
	}
	return w.now().Sub(oldest).Seconds()
}
