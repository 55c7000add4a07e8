package bench

import (
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// Layout is the stream a raw path reads and what its messages carry. The
// plain layout is what a user of nats.go would compare Steward with; the
// STEWARD_EVENTS-shaped ones say what the events stream's own layout costs,
// one of its features switched off at a time.
type Layout int

const (
	// Plain is a stream as a nats.go user makes one: a name, its subjects
	// and file storage, the server's defaults for everything else (no
	// stored notices, no limits of its own, no direct gets).
	Plain Layout = iota
	// Shaped is STEWARD_EVENTS's configuration on subjects of its own, its
	// stored notices republished, the messages as Steward publishes them.
	Shaped
	// ShapedNoNotices is Shaped without the stored notices (RePublish).
	ShapedNoNotices
	// ShapedNoMsgID is Shaped with messages that carry no Nats-Msg-Id: the
	// server's duplicate window then tracks nothing.
	ShapedNoMsgID
	// ShapedSmallHeaders is Shaped with messages whose headers are cut to
	// the event's id and Nats-Msg-Id (the CloudEvents attributes dropped),
	// so the stored message and its notice are smaller.
	ShapedSmallHeaders
)

// layouts are every Layout, in the order the report lists them.
var layouts = []Layout{Plain, Shaped, ShapedNoNotices, ShapedNoMsgID, ShapedSmallHeaders}

// String says what the layout is, as the report names its paths.
func (l Layout) String() string {
	return [...]string{"plain stream", "STEWARD_EVENTS-shaped", "shaped, no stored notices",
		"shaped, no Nats-Msg-Id", "shaped, headers cut to the ids"}[l]
}

// stream is the name of the layout's stream. The message variants share
// Shaped's stream: what differs is only what they publish.
func (l Layout) stream() string {
	switch l {
	case Plain:
		return "BENCH_PLAIN"
	case ShapedNoNotices:
		return "BENCH_SHAPED_NO_NOTICES"
	}
	return "BENCH_SHAPED"
}

// prefix is where the layout's stream takes its subjects: apart from
// steward.events, so the runtime's consumers never see the raw paths'
// events.
func (l Layout) prefix() string {
	switch l {
	case Plain:
		return "bench.plain"
	case ShapedNoNotices:
		return "bench.shaped-no-notices"
	}
	return "bench.shaped"
}

// storedPrefix is where Shaped's stream republishes its stored notices.
const storedPrefix = "bench.shaped-stored"

// streamConfig is the layout's stream as the bench creates it.
func (l Layout) streamConfig() jetstream.StreamConfig {
	subjects := []string{l.prefix() + ".>"}
	if l == Plain {
		return jetstream.StreamConfig{Name: l.stream(), Subjects: subjects, Storage: jetstream.FileStorage}
	}
	var cfg jetstream.StreamConfig
	for _, c := range events.DefaultStreamConfig().StreamConfigs() {
		if c.Name == events.StreamEvents {
			cfg = c
		}
	}
	cfg.Name, cfg.Subjects, cfg.Description = l.stream(), subjects, "the bench's raw paths, laid out as "+events.StreamEvents
	cfg.RePublish = &jetstream.RePublish{Source: l.prefix() + ".>", Destination: storedPrefix + ".>", HeadersOnly: true}
	if l == ShapedNoNotices {
		cfg.RePublish = nil
	}
	return cfg
}

// streams are the layouts' streams, each once.
func streams() []jetstream.StreamConfig {
	var out []jetstream.StreamConfig
	seen := map[string]bool{}
	for _, l := range layouts {
		if !seen[l.stream()] {
			seen[l.stream()] = true
			out = append(out, l.streamConfig())
		}
	}
	return out
}

// idHeader is the header every path reads the event's id from.
const idHeader = "ce-id"

// reshape moves msgs, Steward's events, onto the layout's subjects and
// cuts their headers as the layout says.
func (l Layout) reshape(msgs []*nats.Msg) {
	for _, m := range msgs {
		m.Subject = l.prefix() + strings.TrimPrefix(m.Subject, events.EventsPrefix)
		switch l {
		case ShapedNoMsgID:
			m.Header.Del(events.MsgIDHeader)
		case ShapedSmallHeaders:
			m.Header = nats.Header{idHeader: {m.Header.Get(idHeader)}, events.MsgIDHeader: {m.Header.Get(events.MsgIDHeader)}}
		}
	}
}
