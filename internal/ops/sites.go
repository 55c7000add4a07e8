package ops

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// Site is what the hub knows of one site (docs/design.md §9): whether its
// leaf node is sourcing now, and how far behind it is, from the hub's
// durable consumer for it.
type Site struct {
	Name string `json:"name"`
	// Linked says the site's source is bound to the hub's consumer now:
	// its leaf node is linked and its stream is sourcing.
	Linked bool `json:"linked"`
	// Pending is how many of the site's events the hub holds and has not
	// sent it yet: during a cut, every event published for the site since.
	Pending uint64 `json:"pending"`
	// Unconfirmed is how many were sent and not yet confirmed by the
	// site's flow control: stored at the site, or lost with a cut and sent
	// again when the site resets the consumer. Confirmations come in
	// windows, so a site that is caught up can show some.
	Unconfirmed int `json:"unconfirmed"`
	// Subjects is how many subjects the site receives (its keys, and the
	// two every site needs).
	Subjects int `json:"subjects"`
	// LastActive is when the site last took or acknowledged an event.
	LastActive *time.Time `json:"lastActive,omitempty"`
}

// Sites lists the sites set up at this hub (`steward site setup`), one
// paged listing of STEWARD_EVENTS' consumers.
func Sites(ctx context.Context, js jetstream.JetStream) ([]Site, error) {
	s, err := streamOrNone(ctx, js, events.StreamEvents)
	if err != nil {
		return nil, err
	}
	if s == nil {
		return nil, &NoStreamsError{Server: ServerURL(js)}
	}
	var out []Site
	lister := s.ListConsumers(ctx)
	for info := range lister.Info() {
		name, ok := events.SiteOfConsumer(info.Config)
		if !ok {
			continue
		}
		out = append(out, Site{Name: name, Linked: info.PushBound,
			Pending: info.NumPending, Unconfirmed: info.NumAckPending,
			Subjects:   len(info.Config.FilterSubjects),
			LastActive: latest(info.Delivered.Last, info.AckFloor.Last)})
	}
	if err := lister.Err(); err != nil {
		return nil, fmt.Errorf("list the consumers of %s: %w", events.StreamEvents, err)
	}
	slices.SortFunc(out, func(a, b Site) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}
