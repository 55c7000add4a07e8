package ops

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// Settled reports whether the worker instance has settled every event
// stored for its subjects, whichever way it reads them: through its durable
// consumer (acknowledged up to the last such event, nothing pending or
// unacknowledged), or from the stream (its cursor at or past the last
// event of every subject). The string says what was found. Tests wait on
// it (workertest.WaitIdle).
func Settled(ctx context.Context, js jetstream.JetStream, worker, instance string) (bool, string, error) {
	stream, err := js.Stream(ctx, events.StreamEvents)
	if err != nil {
		return false, "", err
	}
	name := ConsumerName(worker, instance)
	c, err := stream.Consumer(ctx, name)
	if err == nil {
		return consumerSettled(ctx, stream, c)
	}
	if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return false, "", err
	}
	store, err := events.OpenStore(ctx, js, events.StoreOptions{})
	if err != nil {
		return false, "", fmt.Errorf("no consumer %s, and %w", name, err)
	}
	d, err := store.Get(ctx, events.CursorKey(worker, instance))
	if err != nil {
		return false, "", err
	}
	if !d.Present() {
		return false, "no consumer " + name + " and no stream cursor yet", nil
	}
	var doc events.Cursor
	if err := d.Decode(&doc); err != nil {
		return false, "", err
	}
	var behind []string
	for subj, at := range doc.Subjects {
		m, err := stream.GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return false, "", err
		}
		if m.Sequence > at {
			behind = append(behind, fmt.Sprintf("%s at %d of %d", subj, at, m.Sequence))
		}
	}
	if len(behind) > 0 {
		return false, "stream reader behind: " + strings.Join(behind, ", "), nil
	}
	return true, "stream reader settled", nil
}

func consumerSettled(ctx context.Context, stream jetstream.Stream, c jetstream.Consumer) (bool, string, error) {
	info, err := c.Info(ctx)
	if err != nil {
		return false, "", err
	}
	filters := info.Config.FilterSubjects
	if info.Config.FilterSubject != "" {
		filters = append(filters, info.Config.FilterSubject)
	}
	var last uint64
	for _, f := range filters {
		m, err := stream.GetLastMsgForSubject(ctx, f)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return false, "", err
		}
		last = max(last, m.Sequence)
	}
	state := fmt.Sprintf("last event %d, acknowledged up to %d, pending %d, unacknowledged %d",
		last, info.AckFloor.Stream, info.NumPending, info.NumAckPending)
	return info.AckFloor.Stream >= last && info.NumAckPending == 0 && info.NumPending == 0, state, nil
}
