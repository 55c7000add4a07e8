package workers

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/steward-dev/steward/events"
)

// publishStatus writes the status document when it says something new, and
// the gauges every time. The last one, at shutdown, says the process
// stopped.
func (w *Runtime) publishStatus(final bool) {
	st := events.Status{Worker: w.spec.Name, Instance: w.spec.Instance, Process: processName(), UpdatedAt: w.now().UTC(), Stopped: final}
	st.Forged, st.Forgeries = w.forged.snapshot()
	var oldestHeld time.Time
	st.Retrying, st.Waiting, oldestHeld = w.queue.status()
	w.m.retrying.Set(float64(len(st.Retrying)))
	w.m.waiting.Set(float64(len(st.Waiting)))
	oldest := 0.0
	for _, r := range st.Retrying {
		oldest = max(oldest, w.now().Sub(r.FirstFailure).Seconds())
	}
	w.m.oldestRetry.Set(oldest)
	if oldestHeld.IsZero() {
		w.m.oldestHeld.Set(0)
	} else {
		w.m.oldestHeld.Set(w.now().Sub(oldestHeld).Seconds())
	}

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
