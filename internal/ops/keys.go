package ops

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/streamread"
)

// DefaultKeyLimit is how many keys ListKeys returns unless told otherwise.
const DefaultKeyLimit = 500

// KeyOptions selects the keys of one worker.
type KeyOptions struct {
	Worker string
	// Prefix keeps the keys that start with it ("": every key).
	Prefix string
	// Limit is the most keys returned (default DefaultKeyLimit).
	Limit int
}

// KeyList is the keys a worker's events name, in key order.
type KeyList struct {
	Worker string    `json:"worker"`
	Prefix string    `json:"prefix"`
	Keys   []KeyInfo `json:"keys"`
	// More counts the keys past Limit.
	More int `json:"more"`
}

// KeyInfo is one key and how many of its events the stream holds.
type KeyInfo struct {
	Key    string `json:"key"`
	Type   string `json:"type"`
	Events uint64 `json:"events"`
}

// ListKeys lists the keys of the events the worker reads that start with
// o.Prefix. A kind whose key is its subject's last token (credential,
// grant, invitation) is counted from the stream's per-subject counts, one
// stream info that reads no message; a kind on one shared subject
// (releases, host floors: few events, keyed by their data) is read through
// once for its keys.
func ListKeys(ctx context.Context, js jetstream.JetStream, o KeyOptions) (*KeyList, error) {
	if err := events.CheckKey(o.Worker); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	if o.Limit <= 0 {
		o.Limit = DefaultKeyLimit
	}
	l := &KeyList{Worker: o.Worker, Prefix: o.Prefix, Keys: []KeyInfo{}}
	s, err := streamOrNone(ctx, js, events.StreamEvents)
	if err != nil {
		return nil, err
	}
	if s == nil {
		return nil, &NoStreamsError{Server: ServerURL(js)}
	}
	for _, t := range WorkerTypes(o.Worker) {
		k, _ := events.Lookup(t)
		counts, err := keyCounts(ctx, js, s, k)
		if err != nil {
			return nil, err
		}
		for key, n := range counts {
			if strings.HasPrefix(key, o.Prefix) {
				l.Keys = append(l.Keys, KeyInfo{Key: key, Type: t, Events: n})
			}
		}
	}
	slices.SortFunc(l.Keys, func(a, b KeyInfo) int { return cmp.Or(strings.Compare(a.Key, b.Key), strings.Compare(a.Type, b.Type)) })
	if len(l.Keys) > o.Limit {
		l.More = len(l.Keys) - o.Limit
		l.Keys = l.Keys[:o.Limit]
	}
	return l, nil
}

// keyCounts counts the stored events of kind k per key.
func keyCounts(ctx context.Context, js jetstream.JetStream, s jetstream.Stream, k events.Kind) (map[string]uint64, error) {
	out := map[string]uint64{}
	if k.KeyInSubject {
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(k.FilterSubject("")))
		if err != nil {
			return nil, fmt.Errorf("count the keys of %s on %s: %w", k.Type, ServerURL(js), err)
		}
		for subject, n := range info.State.Subjects {
			out[lastToken(subject)] += n
		}
		return out, nil
	}
	err := streamread.Each(ctx, js, streamread.Range{Stream: events.StreamEvents, Subjects: []string{k.Subject}}, func(m jetstream.Msg) error {
		// A message that is not an event names no key; history lists it.
		if e, err := events.Decode(m.Headers(), m.Data()); err == nil && e.Type() == k.Type {
			out[e.Subject()]++
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the keys of %s on %s: %w", k.Type, ServerURL(js), err)
	}
	return out, nil
}
