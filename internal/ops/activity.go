package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// ActivityOptions says what window Activity charts.
type ActivityOptions struct {
	// Now ends the window (zero: time.Now()).
	Now time.Time
	// Minutes is how many minutes back it charts (default 60).
	Minutes int
	// Backlog is the backlog now (Status.Backlog), which the past backlog
	// is worked back from.
	Backlog uint64
	// Index remembers the sequences of past minutes, so a page that
	// refreshes asks the server only for the minute that just began; nil
	// asks for every minute each time.
	Index *TimeIndex
}

// Activity is what came in and what was settled in each minute of the
// last hour, and the backlog at the end of each.
type Activity struct {
	Minutes []MinuteActivity `json:"minutes"`
	// MaxBacklog and MaxRate are the largest backlog and per-minute
	// count, for a chart's scale.
	MaxBacklog uint64 `json:"maxBacklog"`
	MaxRate    uint64 `json:"maxRate"`
}

// MinuteActivity is one minute: Stored is the events STEWARD_EVENTS
// stored in it, Settled the outcomes and dead letters stored in it, and
// Backlog the events not yet settled at its end.
type MinuteActivity struct {
	Start   time.Time `json:"start"`
	Stored  uint64    `json:"stored"`
	Settled uint64    `json:"settled"`
	Backlog uint64    `json:"backlog"`
}

// GetActivity counts each minute of the window with the streams' by-time
// lookups: for each minute's start, the sequence of the first message
// stored at or after it (a message get by start_time, which the server
// answers from its index), so a minute holds the difference of two
// sequences and no message of the hour is read. Settled counts every
// message of STEWARD_OUTCOMES (the workers' applied, refused and
// superseded outcomes, and the ingress's audit events) and of STEWARD_DLQ.
//
// The backlog is worked back from now's: at the end of a minute it was
// the backlog now, less the events stored since, plus what was settled
// since. That is exact when each event has one consumer and settles with
// one outcome or letter. It reads high by every extra message: an event
// that several instances read (a release to several installs) settles
// once per instance, and the ingress's audit events count as settled.
func GetActivity(ctx context.Context, js jetstream.JetStream, o ActivityOptions) (*Activity, error) {
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	if o.Minutes <= 0 {
		o.Minutes = 60
	}
	if o.Index == nil {
		o.Index = NewTimeIndex()
	}
	first := now.Truncate(time.Minute).Add(-time.Duration(o.Minutes-1) * time.Minute)
	streams := []string{events.StreamEvents, events.StreamOutcomes, events.StreamDLQ}
	// seqs[s][k] is the first sequence of stream s stored at or after the
	// start of minute k; seqs[s][Minutes] is the next sequence now.
	seqs := map[string][]uint64{}
	for _, name := range streams {
		s, err := streamOrNone(ctx, js, name)
		if err != nil {
			return nil, err
		}
		row := make([]uint64, o.Minutes+1)
		if s == nil {
			seqs[name] = row
			continue
		}
		state := s.CachedInfo().State
		next := state.LastSeq + 1
		for k := range o.Minutes {
			at := first.Add(time.Duration(k) * time.Minute)
			if row[k], err = o.Index.seqAt(ctx, js, name, at, now, next); err != nil {
				return nil, err
			}
		}
		row[o.Minutes] = next
		seqs[name] = row
	}
	a := &Activity{Minutes: make([]MinuteActivity, o.Minutes)}
	ev, out, dlq := seqs[events.StreamEvents], seqs[events.StreamOutcomes], seqs[events.StreamDLQ]
	for k := range o.Minutes {
		m := MinuteActivity{Start: first.Add(time.Duration(k) * time.Minute).UTC(),
			Stored: ev[k+1] - ev[k], Settled: out[k+1] - out[k] + dlq[k+1] - dlq[k]}
		storedSince := int64(ev[o.Minutes] - ev[k+1])
		settledSince := int64(out[o.Minutes]-out[k+1]) + int64(dlq[o.Minutes]-dlq[k+1])
		m.Backlog = uint64(max(0, int64(o.Backlog)-storedSince+settledSince))
		a.MaxBacklog, a.MaxRate = max(a.MaxBacklog, m.Backlog), max(a.MaxRate, m.Stored, m.Settled)
		a.Minutes[k] = m
	}
	return a, nil
}

// TimeIndex remembers the first sequence stored at or after a time, per
// stream, for times far enough in the past that no message stored later
// can be stamped before them. It is safe for concurrent use.
type TimeIndex struct {
	mu   sync.Mutex
	seqs map[timeKey]uint64
}

type timeKey struct {
	stream string
	at     int64
}

// NewTimeIndex is an empty index.
func NewTimeIndex() *TimeIndex { return &TimeIndex{seqs: map[timeKey]uint64{}} }

// settledAfter is how long after a time the index trusts that the server
// has stamped every message it will stamp before it: the console's and
// the server's clocks may differ by that much.
const settledAfter = 10 * time.Second

// seqAt is the first sequence of stream stored at or after at, or next
// (the stream's next sequence) when none is.
func (x *TimeIndex) seqAt(ctx context.Context, js jetstream.JetStream, stream string, at, now time.Time, next uint64) (uint64, error) {
	key := timeKey{stream, at.UnixNano()}
	x.mu.Lock()
	seq, ok := x.seqs[key]
	if ok && seq > next {
		// A stream made again (a development stack restarted) starts its
		// sequences over: nothing remembered of the old one holds.
		for k := range x.seqs {
			if k.stream == stream {
				delete(x.seqs, k)
			}
		}
		ok = false
	}
	x.mu.Unlock()
	if ok {
		return seq, nil
	}
	seq, err := firstSeqFrom(ctx, js, stream, at, next)
	if err != nil {
		return 0, err
	}
	if now.Sub(at) > settledAfter {
		x.mu.Lock()
		x.seqs[key] = seq
		for k := range x.seqs {
			if k.at < now.Add(-2*time.Hour).UnixNano() {
				delete(x.seqs, k)
			}
		}
		x.mu.Unlock()
	}
	return seq, nil
}

// firstSeqFrom asks the server for the first message of stream stored at
// or after at: a message get by start_time, which nats.go's Stream.GetMsg
// does not offer. next_by_subj ">" makes the server take the next message
// still held when the one at that time was removed.
func firstSeqFrom(ctx context.Context, js jetstream.JetStream, stream string, at time.Time, next uint64) (uint64, error) {
	req, err := json.Marshal(struct {
		StartTime time.Time `json:"start_time"`
		NextFor   string    `json:"next_by_subj"`
		NoHeaders bool      `json:"no_hdr"`
	}{at.UTC(), ">", true})
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	msg, err := js.Conn().RequestWithContext(ctx, apiPrefix(js)+"STREAM.MSG.GET."+stream, req)
	if err != nil {
		return 0, fmt.Errorf("find the first message of %s at %s on %s: %w", stream, at.UTC().Format(time.RFC3339), ServerURL(js), err)
	}
	var resp struct {
		Error *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
		Message *struct {
			Sequence uint64 `json:"seq"`
		} `json:"message"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return 0, fmt.Errorf("find the first message of %s at %s: the server's answer is not JSON: %w", stream, at.UTC().Format(time.RFC3339), err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrCode == int(jetstream.JSErrCodeMessageNotFound):
		return next, nil
	case resp.Error != nil:
		return 0, fmt.Errorf("find the first message of %s at %s on %s: %w", stream, at.UTC().Format(time.RFC3339), ServerURL(js),
			errors.New(resp.Error.Description))
	case resp.Message == nil:
		return 0, fmt.Errorf("find the first message of %s at %s on %s: the answer holds no message", stream, at.UTC().Format(time.RFC3339), ServerURL(js))
	}
	return resp.Message.Sequence, nil
}

// apiPrefix is the JetStream API prefix js sends its requests with: the
// domain's, the one it was given, or the default.
func apiPrefix(js jetstream.JetStream) string {
	o := js.Options()
	switch {
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	}
	return jetstream.DefaultAPIPrefix
}
