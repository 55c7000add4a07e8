// Package streamread reads a range of a stream as it stands now, for
// export, replay, the DLQ commands and tests: an ordered consumer from a
// start point to the last message present when reading began.
package streamread

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Range says where to start and what to read. Zero values mean from the
// first message, every subject, no limit.
type Range struct {
	Stream    string
	Subjects  []string
	StartSeq  uint64
	StartTime time.Time
	// Limit stops after this many messages (0: no limit).
	Limit int
	// Total, when set, is told how many messages the range holds (within
	// Limit) before the first is read, for a progress report.
	Total func(n uint64)
}

// Each calls fn for every message of the range in stream order, and stops at
// the last message that was in the stream when it started, so it always
// ends even while publishers go on.
func Each(ctx context.Context, js jetstream.JetStream, r Range, fn func(jetstream.Msg) error) error {
	stream, err := js.Stream(ctx, r.Stream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", r.Stream, err)
	}
	// A reader that polls (tests waiting on outcomes, consoles) must not
	// pile up consumers: the server removes an idle one soon, and Each
	// deletes its own when it returns.
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: r.Subjects, InactiveThreshold: 5 * time.Second}
	switch {
	case r.StartSeq > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, r.StartSeq
	case !r.StartTime.IsZero():
		t := r.StartTime
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
	}
	cons, err := stream.OrderedConsumer(ctx, cfg)
	if err != nil {
		return fmt.Errorf("read %s: %w", r.Stream, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return fmt.Errorf("read %s: %w", r.Stream, err)
	}
	defer func() {
		if ci := cons.CachedInfo(); ci != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = stream.DeleteConsumer(dctx, ci.Name)
		}
	}()
	remaining := info.NumPending
	if r.Total != nil {
		n := remaining
		if r.Limit > 0 {
			n = min(n, uint64(r.Limit))
		}
		r.Total(n)
	}
	seen := 0
	for remaining > 0 {
		if r.Limit > 0 && seen >= r.Limit {
			return nil
		}
		batch := min(remaining, 256)
		if r.Limit > 0 {
			// A reader that wants a few (the first pending event of a
			// site) is sent no more than it keeps.
			batch = min(batch, uint64(r.Limit-seen))
		}
		msgs, err := cons.Fetch(int(batch), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return fmt.Errorf("read %s: %w", r.Stream, err)
		}
		got := 0
		for msg := range msgs.Messages() {
			got++
			if r.Limit > 0 && seen >= r.Limit {
				continue
			}
			seen++
			if err := fn(msg); err != nil {
				return err
			}
		}
		if err := msgs.Error(); err != nil {
			return fmt.Errorf("read %s: %w", r.Stream, err)
		}
		if got == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			return fmt.Errorf("read %s: %d messages expected but none arrived", r.Stream, remaining)
		}
		remaining -= uint64(got)
	}
	return nil
}
