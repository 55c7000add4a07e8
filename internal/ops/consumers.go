package ops

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// Consumer is a durable consumer on one of Steward's streams.
type Consumer struct {
	Stream string `json:"stream"`
	Name   string `json:"name"`
	// Steward says the runtime created it (a worker instance's consumer);
	// Worker and Instance are then set.
	Steward     bool      `json:"steward"`
	Worker      string    `json:"worker,omitempty"`
	Instance    string    `json:"instance,omitempty"`
	Description string    `json:"description,omitempty"`
	Filters     []string  `json:"filters"`
	Created     time.Time `json:"created"`
	// Consuming says a process pulls from it now.
	Consuming   bool       `json:"consuming"`
	Pending     uint64     `json:"pending"`
	AckPending  int        `json:"ackPending"`
	LastActive  *time.Time `json:"lastActive,omitempty"`
	PausedUntil *time.Time `json:"pausedUntil,omitempty"`
}

// Consumers lists the durable consumers of Steward's three streams, each
// stream with one paged listing. Ordered consumers (export, replay, dlq)
// come and go by themselves and are not listed.
func Consumers(ctx context.Context, js jetstream.JetStream) ([]Consumer, error) {
	var out []Consumer
	found := 0
	for _, name := range []string{events.StreamEvents, events.StreamOutcomes, events.StreamDLQ} {
		s, err := streamOrNone(ctx, js, name)
		if err != nil {
			return nil, err
		}
		if s == nil {
			continue
		}
		found++
		infos, err := listConsumers(ctx, s, name)
		if err != nil {
			return nil, err
		}
		for _, info := range infos {
			if info.Config.Durable == "" {
				continue
			}
			out = append(out, consumerOf(info))
		}
	}
	if found == 0 {
		return nil, &NoStreamsError{Server: ServerURL(js)}
	}
	slices.SortFunc(out, func(a, b Consumer) int {
		if c := strings.Compare(a.Stream, b.Stream); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out, nil
}

func consumerOf(info *jetstream.ConsumerInfo) Consumer {
	c := Consumer{Stream: info.Stream, Name: info.Name, Description: info.Config.Description,
		Filters: info.Config.FilterSubjects, Created: info.Created.UTC(),
		Consuming: info.NumWaiting > 0 || info.PushBound, Pending: info.NumPending, AckPending: info.NumAckPending,
		LastActive: latest(info.Delivered.Last, info.AckFloor.Last)}
	if len(c.Filters) == 0 && info.Config.FilterSubject != "" {
		c.Filters = []string{info.Config.FilterSubject}
	}
	if c.Filters == nil {
		c.Filters = []string{}
	}
	c.Worker, c.Instance, c.Steward = SplitConsumer(info.Name, info.Config.Description)
	if info.Paused && info.Config.PauseUntil != nil {
		u := info.Config.PauseUntil.UTC()
		c.PausedUntil = &u
	}
	return c
}

// ErrConsuming refuses to remove a consumer a process is pulling from.
var ErrConsuming = errors.New("a process is consuming it")

// RemoveConsumer deletes a durable consumer Steward created on
// STEWARD_EVENTS (a worker instance's, or one an older `replay --dry-run`
// left). It refuses a consumer Steward did not create, and one a process is
// pulling from unless force: the process would stop receiving events, and
// would not make its consumer again until it restarts.
func RemoveConsumer(ctx context.Context, js jetstream.JetStream, name string, force bool) (Consumer, error) {
	s, err := streamOrNone(ctx, js, events.StreamEvents)
	if err != nil {
		return Consumer{}, err
	}
	if s == nil {
		return Consumer{}, &NoStreamsError{Server: ServerURL(js)}
	}
	cons, err := s.Consumer(ctx, name)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return Consumer{}, fmt.Errorf("%s has no consumer %s at %s: list them with `steward consumers ls`", events.StreamEvents, name, ServerURL(js))
	}
	if err != nil {
		return Consumer{}, fmt.Errorf("look up consumer %s: %w", name, err)
	}
	c := consumerOf(cons.CachedInfo())
	if !c.Steward {
		return c, fmt.Errorf("consumer %s on %s was not created by Steward (its description is %q): remove it with the tool that made it, e.g. `nats consumer rm`",
			name, events.StreamEvents, c.Description)
	}
	if c.Consuming && !force {
		return c, fmt.Errorf("consumer %s: %w (%d pull requests waiting): stop its processes first, or give --force", name, ErrConsuming, cons.CachedInfo().NumWaiting)
	}
	if err := s.DeleteConsumer(ctx, name); err != nil {
		return c, fmt.Errorf("remove consumer %s: %w", name, err)
	}
	return c, nil
}

// listConsumers reads every consumer of stream s with one paged listing,
// each once. The server pages by an offset into its list as it stands at
// each request, and can count in a page's total a consumer being deleted
// that it no longer returns: the next page then starts one too early and
// hands back the last consumer again (CI once saw a site listed twice, just
// after a status had deleted the ordered consumer that read the site's
// oldest pending event). A name is unique in its stream, so one seen
// already is that.
func listConsumers(ctx context.Context, s jetstream.Stream, stream string) ([]*jetstream.ConsumerInfo, error) {
	lister := s.ListConsumers(ctx)
	infos := onceEach(lister.Info())
	if err := lister.Err(); err != nil {
		return nil, fmt.Errorf("list the consumers of %s: %w", stream, err)
	}
	return infos, nil
}

// onceEach collects the consumers infos yields, dropping one whose name it
// has collected already.
func onceEach(infos <-chan *jetstream.ConsumerInfo) []*jetstream.ConsumerInfo {
	var out []*jetstream.ConsumerInfo
	seen := map[string]bool{}
	for info := range infos {
		if !seen[info.Name] {
			seen[info.Name] = true
			out = append(out, info)
		}
	}
	return out
}
