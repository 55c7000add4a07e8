package workers

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"time"
)

// Status is the document a worker instance keeps in the checkpoint bucket
// under StatusKey: the keys it is retrying and the keys waiting behind an
// earlier event held elsewhere, so `steward status` can say what is stuck
// and why without asking the server about every consumer. It is written
// at most every status interval, and only when it changed; errors in it
// have armored secrets elided.
type Status struct {
	Worker    string        `json:"worker"`
	Instance  string        `json:"instance"`
	Process   string        `json:"process"`
	UpdatedAt time.Time     `json:"updatedAt"`
	Stopped   bool          `json:"stopped,omitempty"`
	Retrying  []RetryingKey `json:"retrying"`
	Waiting   []WaitingKey  `json:"waiting"`
}

// RetryingKey is a key whose event failed and is retried.
type RetryingKey struct {
	Key          string    `json:"key"`
	EventID      string    `json:"eventId"`
	Sequence     uint64    `json:"sequence"`
	Attempt      uint64    `json:"attempt"`
	FirstFailure time.Time `json:"firstFailure"`
	NextAttempt  time.Time `json:"nextAttempt"`
	LastError    string    `json:"lastError"`
}

// WaitingKey is a key whose next event waits for an earlier one.
type WaitingKey struct {
	Key      string    `json:"key"`
	EventID  string    `json:"eventId"`
	Sequence uint64    `json:"sequence"`
	Behind   uint64    `json:"behind"`
	Since    time.Time `json:"since"`
}

// StatusKey is where the status document of a worker instance is kept in
// CheckpointBucket.
func StatusKey(worker, instance string) string { return "rt." + worker + "." + instance }

// ReadStatus reads the status document of a worker instance; a missing one
// (nothing ever retried) is reported as false.
func ReadStatus(ctx context.Context, s *State, worker, instance string) (Status, bool, error) {
	var st Status
	kv, err := s.bucket(ctx)
	if err != nil {
		return st, false, err
	}
	entry, err := kv.Get(ctx, StatusKey(worker, instance))
	if err != nil {
		if isNotFound(err) {
			return st, false, nil
		}
		return st, false, fmt.Errorf("read the status of %s-%s: %w", worker, instance, err)
	}
	if err := json.Unmarshal(entry.Value(), &st); err != nil {
		return st, false, fmt.Errorf("the status of %s-%s is not readable: %w", worker, instance, err)
	}
	return st, true, nil
}

// snapshot is the worker's current status, keys in order.
func (w *Runtime) snapshot() Status {
	st := Status{Worker: w.spec.Name, Instance: w.spec.Instance, Process: processName(), UpdatedAt: w.now().UTC(),
		Retrying: []RetryingKey{}, Waiting: []WaitingKey{}}
	w.mu.Lock()
	for _, h := range w.held {
		if h.attempts > 0 {
			st.Retrying = append(st.Retrying, RetryingKey{
				Key: h.key, EventID: h.event.ID(), Sequence: h.seq, Attempt: h.attempts,
				FirstFailure: h.firstFailure.UTC(), NextAttempt: h.retryAt.UTC(), LastError: h.lastError,
			})
		}
	}
	for _, l := range w.lanes {
		if l.waitFor != 0 && len(l.queue) > 0 {
			h := l.queue[0]
			st.Waiting = append(st.Waiting, WaitingKey{Key: h.key, EventID: h.event.ID(), Sequence: h.seq, Behind: l.waitFor, Since: h.deferredSince.UTC()})
		}
	}
	w.mu.Unlock()
	slices.SortFunc(st.Retrying, func(a, b RetryingKey) int { return int(a.Sequence) - int(b.Sequence) })
	slices.SortFunc(st.Waiting, func(a, b WaitingKey) int { return int(a.Sequence) - int(b.Sequence) })
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
	if w.lastStatus == nil && len(st.Retrying) == 0 && len(st.Waiting) == 0 {
		// Nothing has ever been stuck here: no document, no write.
		return
	}
	doc, _ := json.Marshal(st)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := w.kv.Put(ctx, StatusKey(w.spec.Name, w.spec.Instance), doc); err != nil {
		w.log.Debug().Err(err).Msg("status document not written; trying again at the next interval")
		return
	}
	w.lastStatus = raw
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
