package events

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Stream names: the three streams every part of Steward agrees on.
const (
	StreamEvents   = "STEWARD_EVENTS"
	StreamOutcomes = "STEWARD_OUTCOMES"
	StreamDLQ      = "STEWARD_DLQ"
)

// Defaults of the streams' limits. Every limit is set explicitly on the
// stream: a limit left to the server changes under Steward with the
// server's version (nats-server 2.15 caps a stream that sets none at 1,000
// consumers, which stops a fleet's 1,001st host from starting).
const (
	// DefaultMaxConsumers is how many consumers STEWARD_EVENTS may hold:
	// one per worker instance and a few for tools. It is sized for a fleet
	// of ten thousand hosts with two host-bound workers each; `steward
	// setup --max-consumers` raises it.
	DefaultMaxConsumers = 25_000
	// DefaultMaxBytes bounds STEWARD_EVENTS and STEWARD_OUTCOMES each.
	DefaultMaxBytes = 8 << 30
	// DefaultMaxMsgSize bounds one event, outcome or dead letter: an
	// event is one key's desired state, never a bulk payload.
	DefaultMaxMsgSize = 1 << 20
	// DefaultDLQMaxBytes bounds STEWARD_DLQ.
	DefaultDLQMaxBytes = 1 << 30
	// DefaultDLQMaxAge is how long a dead letter is kept: long enough for
	// an operator to notice and retry it, not forever.
	DefaultDLQMaxAge = 90 * 24 * time.Hour
)

// StoredPrefix is where STEWARD_EVENTS republishes the headers of every
// event once it is stored: steward.stored.<the event subject after
// steward.events>. A fleet instance that reads the stream (the runtime's
// ReadStream) subscribes there, so it is woken only when there is
// something to read: a subscriber to the event subject itself may hear of
// an event before the stream has stored it.
const StoredPrefix = "steward.stored"

// DefaultNotices is StreamConfig.Notices by default: a stored notice of
// every event, so an instance of any worker kind may read the stream.
const DefaultNotices = EventsPrefix + ".>"

// ControlSubject is where an operator's tools tell a stream-reading
// instance to look again at once (after a pause ends, say). The message's
// content is not read.
func ControlSubject(worker, instance string) string {
	return "steward.control." + worker + "." + instance
}

// StoredSubject is where the stored notice of events on subject goes.
func StoredSubject(subject string) string {
	return StoredPrefix + strings.TrimPrefix(subject, EventsPrefix)
}

// StreamConfig is how the three streams are laid out, with their limits.
// The zero value is not useful; start from DefaultStreamConfig. Creating
// and updating the streams with it is an operator's act (`steward setup`,
// EnsureStreams); workers only create what is missing (CreateMissingStreams)
// and never overwrite the limits an operator set.
type StreamConfig struct {
	// Replicas is the copies each stream keeps (1, or 3 on a cluster).
	Replicas int
	// Dedupe is JetStream's duplicate window: an event republished with the
	// same id inside it is stored once.
	Dedupe time.Duration
	// Retention is how long events and outcomes are kept for replay.
	Retention time.Duration
	// MaxConsumers bounds the consumers of STEWARD_EVENTS (one per worker
	// instance). It must be positive: the server replaces 0 and -1 by its
	// own default.
	MaxConsumers int
	// MaxBytes bounds STEWARD_EVENTS and STEWARD_OUTCOMES each. A full
	// stream refuses new messages (the publisher sees the error); it never
	// drops stored ones.
	MaxBytes int64
	// MaxMsgSize bounds one message on every stream.
	MaxMsgSize int32
	// DLQMaxAge is how long dead letters are kept.
	DLQMaxAge time.Duration
	// DLQMaxBytes bounds STEWARD_DLQ; full, it refuses new dead letters
	// (the worker keeps the event and retries), never drops stored ones.
	DLQMaxBytes int64
	// Notices is the subject filter, under steward.events, of the events
	// whose stored notices STEWARD_EVENTS republishes on StoredPrefix;
	// empty, it republishes none. A stream-reading instance wakes on
	// nothing else, so one whose subjects it does not cover refuses to
	// start. Each notice costs the server a read of its subject's last
	// message and a message of its own, whether anyone listens or not: a
	// bus that no instance reads in stream mode needs none
	// (docs/benchmarks.md, 2026-12-07).
	Notices string
}

// DefaultStreamConfig is one replica, a two-minute dedupe window, thirty
// days of replay and the Default* limits.
func DefaultStreamConfig() StreamConfig {
	return StreamConfig{
		Replicas: 1, Dedupe: 2 * time.Minute, Retention: 30 * 24 * time.Hour,
		MaxConsumers: DefaultMaxConsumers, MaxBytes: DefaultMaxBytes, MaxMsgSize: DefaultMaxMsgSize,
		DLQMaxAge: DefaultDLQMaxAge, DLQMaxBytes: DefaultDLQMaxBytes,
		Notices: DefaultNotices,
	}
}

// Check refuses a configuration whose limits the server would replace by
// its own defaults or that cannot hold one event.
func (c StreamConfig) Check() error {
	switch {
	case c.Replicas < 1 || c.Replicas > 5:
		return fmt.Errorf("stream replicas %d: want 1 to 5", c.Replicas)
	case c.MaxConsumers < 1:
		return fmt.Errorf("max consumers %d: want at least 1 (the server replaces 0 and -1 by its default of 1,000)", c.MaxConsumers)
	case c.MaxBytes < 1 || c.DLQMaxBytes < 1:
		return fmt.Errorf("max bytes %d and DLQ max bytes %d: want both positive", c.MaxBytes, c.DLQMaxBytes)
	case c.MaxMsgSize < 1024:
		return fmt.Errorf("max message size %d: want at least 1024 bytes", c.MaxMsgSize)
	case c.Retention <= 0 || c.DLQMaxAge <= 0:
		return fmt.Errorf("retention %v and DLQ max age %v: want both positive", c.Retention, c.DLQMaxAge)
	case c.Notices != "" && !noticeFilter(c.Notices):
		return fmt.Errorf("stored notices %q: want %s (every event), a narrower filter under %s ending in .> or naming one subject, or none (empty; steward setup --stored-notices none)", c.Notices, DefaultNotices, EventsPrefix)
	}
	return nil
}

// noticeFilter says whether filter can be the source of STEWARD_EVENTS's
// stored notices: a subject under steward.events whose only wildcard is a
// last ">", which the notice's subject maps one to one (StoredSubject).
func noticeFilter(filter string) bool {
	rest, ok := strings.CutPrefix(filter, EventsPrefix+".")
	if !ok {
		return false
	}
	tokens := strings.Split(rest, ".")
	for i, t := range tokens {
		last := i == len(tokens)-1
		if t == "" || strings.ContainsAny(t, "* \t\r\n") || (strings.Contains(t, ">") && (t != ">" || !last)) {
			return false
		}
	}
	return true
}

// NoticesCover says whether the stored notices of a stream that
// republishes source (its RePublish source; empty is every subject) are
// sent for every subject that subject, a filter, matches.
func NoticesCover(source, subject string) bool {
	return source == "" || FilterCovers(source, subject)
}

// FilterCovers says whether filter matches, by NATS's wildcards ("*" one
// token, a last ">" one or more), every subject that subject matches:
// subject itself when it is literal, or each one a filter of its own
// stands for.
func FilterCovers(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, ft := range f {
		if ft == ">" {
			return len(s) > i
		}
		if i >= len(s) {
			return false
		}
		switch st := s[i]; {
		case ft == "*":
			if st == ">" {
				return false
			}
		case ft != st:
			return false
		}
	}
	return len(f) == len(s)
}

// StreamConfigs returns the JetStream configuration of the three streams.
// Every stream discards new messages at its limits: desired state already
// stored is never dropped to make room, and the publisher is told.
func (c StreamConfig) StreamConfigs() []jetstream.StreamConfig {
	replicas := max(c.Replicas, 1)
	var notices *jetstream.RePublish
	if c.Notices != "" {
		// Headers only: a notice, never a second copy of the data.
		notices = &jetstream.RePublish{Source: c.Notices, Destination: StoredSubject(c.Notices), HeadersOnly: true}
	}
	return []jetstream.StreamConfig{
		{
			Name: StreamEvents, Subjects: []string{EventsPrefix + ".>"},
			Storage: jetstream.FileStorage, Replicas: replicas,
			Duplicates: c.Dedupe, MaxAge: c.Retention,
			MaxConsumers: c.MaxConsumers, MaxBytes: c.MaxBytes, MaxMsgSize: c.MaxMsgSize,
			// Reads by sequence (the order check, fleet instances reading
			// the stream) are answered by the stream's own direct-get
			// responders instead of queueing on the JetStream API.
			AllowDirect: true,
			RePublish:   notices,
			Discard:     jetstream.DiscardNew,
			Description: "Steward state changes, kept for replay",
		},
		{
			Name: StreamOutcomes, Subjects: []string{OutcomesPrefix + ".>"},
			Storage: jetstream.FileStorage, Replicas: replicas,
			Duplicates: c.Dedupe, MaxAge: c.Retention,
			MaxConsumers: c.MaxConsumers, MaxBytes: c.MaxBytes, MaxMsgSize: c.MaxMsgSize,
			Discard:     jetstream.DiscardNew,
			Description: "what Steward's workers did",
		},
		{
			Name: StreamDLQ, Subjects: []string{DLQPrefix + ".>"},
			Storage: jetstream.FileStorage, Replicas: replicas,
			Duplicates: c.Dedupe, MaxAge: c.DLQMaxAge,
			MaxConsumers: c.MaxConsumers, MaxBytes: c.DLQMaxBytes, MaxMsgSize: c.MaxMsgSize,
			Discard:     jetstream.DiscardNew,
			Description: "events a worker could not apply, with the reason",
		},
	}
}

// EnsureStreams creates the three streams or updates them to cfg, limits
// included, keeping the sources a stream has (the sites', SetupSite). It is the operator's act (`steward setup`, `steward dev`):
// workers call CreateMissingStreams, which leaves existing limits alone.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) error {
	if err := cfg.Check(); err != nil {
		return err
	}
	for _, sc := range cfg.StreamConfigs() {
		// The sources of a hub's outcomes and dead letters are the sites'
		// (SetupSite): updating the limits keeps them.
		if st, err := js.Stream(ctx, sc.Name); err == nil {
			sc.Sources = st.CachedInfo().Config.Sources
		}
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("create or update stream %s (replicas %d): %w", sc.Name, sc.Replicas, describeCreateError(err))
		}
	}
	return nil
}

// CreateMissingStreams creates those of the three streams that do not exist,
// with cfg, and leaves the others as an operator set them: a worker
// starting must never reset limits raised or lowered by `steward setup`.
// When its identity may not create a stream, the error names the stream
// and the command that creates it.
func CreateMissingStreams(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) error {
	if err := cfg.Check(); err != nil {
		return err
	}
	for _, sc := range cfg.StreamConfigs() {
		_, err := js.Stream(ctx, sc.Name)
		if err == nil {
			continue
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("look up stream %s: %w", sc.Name, describeCreateError(err))
		}
		_, err = js.CreateStream(ctx, sc)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			// Another process created it meanwhile, perhaps with other
			// limits: theirs stand.
			continue
		}
		if err != nil {
			return fmt.Errorf("stream %s does not exist and could not be created: %w; "+
				"create it with `steward setup` run with operator credentials (--nats-creds)",
				sc.Name, describeCreateError(err))
		}
	}
	return nil
}

// describeCreateError says what a refused create means: a permissions
// violation on the JetStream API is the identity lacking the operator's
// right, and is said so.
func describeCreateError(err error) error {
	if errors.Is(err, nats.ErrPermissionViolation) {
		return fmt.Errorf("this NATS identity may not manage streams (%w)", err)
	}
	return err
}

// JetStream error codes of a full stream, read by LimitError.
const (
	errCodeMaxBytes     = 10077 // JSStreamStoreFailedF with "maximum bytes exceeded"
	errCodeMsgTooLarge  = 10054 // JSStreamMessageExceedsMaximumErr
	errCodeMaxConsumers = 10026 // JSMaximumConsumersLimitErr
)

// LimitError is a refusal because a stream reached one of its limits. It
// names the stream, the limit, the setting that raises it and, where it
// was read, the current count.
type LimitError struct {
	Stream  string
	Limit   string // the JetStream field: max_bytes, max_msg_size, max_consumers
	Setting string // what raises it: a `steward setup` flag
	Value   int64  // the limit now, when known
	Current int64  // the count now, when known
	Err     error
}

func (e *LimitError) Error() string {
	s := fmt.Sprintf("stream %s reached its %s", e.Stream, e.Limit)
	if e.Value > 0 {
		s += fmt.Sprintf(" of %d", e.Value)
	}
	if e.Current > 0 {
		s += fmt.Sprintf(" (now %d)", e.Current)
	}
	return s + fmt.Sprintf(": nothing stored was dropped; raise it with `steward setup %s` or make room: %v", e.Setting, e.Err)
}

func (e *LimitError) Unwrap() error { return e.Err }

// AsLimitError returns err as a LimitError of stream when JetStream refused
// it for one of the stream's limits, reading the limit and the count from
// info when given; otherwise it returns nil. Publishers and workers wrap
// refusals with it so the operator reads which limit and how to raise it.
func AsLimitError(stream string, err error, info *jetstream.StreamInfo) *LimitError {
	var apiErr *jetstream.APIError
	if err == nil || !errors.As(err, &apiErr) {
		return nil
	}
	le := &LimitError{Stream: stream, Err: err}
	switch int(apiErr.ErrorCode) {
	case errCodeMaxBytes:
		// The code covers every store failure; only this one is a limit.
		if !strings.Contains(apiErr.Description, "maximum bytes") {
			return nil
		}
		le.Limit, le.Setting = "max_bytes", "--max-bytes (STEWARD_MAX_BYTES)"
		if stream == StreamDLQ {
			le.Setting = "--dlq-max-bytes (STEWARD_DLQ_MAX_BYTES)"
		}
		if info != nil {
			le.Value, le.Current = info.Config.MaxBytes, int64(info.State.Bytes)
		}
	case errCodeMsgTooLarge:
		le.Limit, le.Setting = "max_msg_size", "--max-msg-size (STEWARD_MAX_MSG_SIZE)"
		if info != nil {
			le.Value = int64(info.Config.MaxMsgSize)
		}
	case errCodeMaxConsumers:
		le.Limit, le.Setting = "max_consumers", "--max-consumers (STEWARD_MAX_CONSUMERS)"
		if info != nil {
			le.Value, le.Current = int64(info.Config.MaxConsumers), int64(info.State.Consumers)
		}
	default:
		return nil
	}
	return le
}
