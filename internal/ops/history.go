package ops

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/redact"
	"github.com/steward-dev/steward/internal/streamread"
)

// Kinds of history entries.
const (
	EntryEvent      = "event"
	EntryOutcome    = "outcome"
	EntryDeadLetter = "dead-letter"
)

// workerTypes are the event types each of Steward's workers consumes, so a
// key's history reads only the subjects its worker reads. A worker not
// named here (a fifth one) is given every kind.
var workerTypes = map[string][]string{
	"converge":   {events.TypeReleasePublished},
	"join":       {events.TypeInvitationWritten, events.TypeHostFloorPublished},
	"credential": {events.TypeCredentialRotated},
	"provision":  {events.TypeGrantChanged},
}

// HistoryOptions selects the history of one key.
type HistoryOptions struct {
	// Worker and Key name the history: the key's events as that worker
	// reads them, and what its instances did with them.
	Worker, Key string
	// Instance keeps only the outcomes and dead letters of that instance.
	Instance string
	// Since starts the history at this time (zero: the first kept).
	Since time.Time
	// Proofs checks each outcome and dead letter as its instance's; the
	// zero value marks them unverified.
	Proofs Proofs
}

// History is what happened to one key: its events, and the outcomes and
// dead letters they caused, in the order they were stored.
type History struct {
	Server  string  `json:"server"`
	Worker  string  `json:"worker"`
	Key     string  `json:"key"`
	Entries []Entry `json:"entries"`
	// Unreadable are stored messages of the subjects read that are not
	// CloudEvents; they are left out of Entries.
	Unreadable []Unreadable `json:"unreadable"`
	// Forged counts the entries marked Forged.
	Forged int `json:"forged"`

	// follow and through are where FollowHistory goes on from: the
	// reader of the key (with the events read), and the last sequence
	// read of each stream.
	follow  *keyReader
	through map[string]uint64
}

// Entry is one event, outcome or dead letter of a key's history.
type Entry struct {
	Kind     string `json:"kind"`
	Stream   string `json:"stream"`
	Sequence uint64 `json:"sequence"`
	Subject  string `json:"subject"`
	// Time is when the server stored it.
	Time time.Time `json:"time"`
	ID   string    `json:"id"`
	Type string    `json:"type"`
	Key  string    `json:"key"`
	// Outcome is an outcome's name (applied, refused, ...).
	Outcome string `json:"outcome,omitempty"`
	// CausationID is the event an outcome or a dead letter is about.
	CausationID string `json:"causationId,omitempty"`
	// TraceID is the W3C trace id of the traceparent extension, when set.
	TraceID string `json:"traceId,omitempty"`
	// Instance is the worker instance of an outcome or dead letter.
	Instance string `json:"instance,omitempty"`
	// Rule is the rule a refused outcome names (a constant of its
	// worker: downgrade, signature, ...), so a refusal reads as the rule
	// broken, not only as "refused".
	Rule string `json:"rule,omitempty"`
	// Reason is why: a refused or superseded outcome's reason (its data's
	// reason), a dead letter's Steward-Error; secrets elided, on one line.
	Reason string `json:"reason,omitempty"`
	// SupersededBy is the id of the event that superseded a superseded
	// outcome's event, so its entry can be found in the same history.
	SupersededBy string `json:"supersededBy,omitempty"`
	// Replay marks an outcome a replay emitted, not the live consumer.
	Replay bool `json:"replay,omitempty"`
	// Forged says why an outcome or dead letter is not believed: it
	// carries no proof, or one that does not verify as the instance its
	// subject names. It is listed so the forgery is seen, never as what
	// the instance did.
	Forged string `json:"forged,omitempty"`
	// Unverified says the outcome or dead letter could not be checked:
	// the reader had no document keys (HistoryOptions.Proofs), or it was
	// stored unsigned before the upgrade record, by the version before
	// proofs.
	Unverified bool `json:"unverified,omitempty"`
}

// Unreadable is a stored message that could not be read as an event.
type Unreadable struct {
	Stream   string `json:"stream"`
	Sequence uint64 `json:"sequence"`
	Subject  string `json:"subject"`
	Error    string `json:"error"`
}

// GetHistory reads the history of one key: every event of the key on the
// worker's subjects, then the outcomes and dead letters of the worker whose
// causation names one of them or whose subject attribute is the key. Each
// outcome and dead letter is checked with o.Proofs: one that does not
// verify as its instance's is kept in the history, marked Forged, so what
// someone made the bus store is seen and never read as what happened.
func GetHistory(ctx context.Context, js jetstream.JetStream, o HistoryOptions) (*History, error) {
	if err := events.CheckKey(o.Worker); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	if o.Key == "" {
		return nil, errors.New("no key given: name the key whose history to read")
	}
	if o.Instance != "" {
		if err := events.CheckKey(o.Instance); err != nil {
			return nil, fmt.Errorf("instance: %w", err)
		}
	}
	h := &History{Server: ServerURL(js), Worker: o.Worker, Key: o.Key, Entries: []Entry{}, Unreadable: []Unreadable{}}
	if s, err := streamOrNone(ctx, js, events.StreamEvents); err != nil {
		return nil, err
	} else if s == nil {
		return nil, &NoStreamsError{Server: h.Server}
	}

	subjects, err := keySubjects(o.Worker, o.Key)
	if err != nil {
		return nil, err
	}
	tail := ">"
	if o.Instance != "" {
		tail = o.Instance
	}
	k := &keyReader{o: o, ids: map[string]bool{}, subjects: map[string][]string{
		events.StreamEvents:   subjects,
		events.StreamOutcomes: {events.OutcomesPrefix + "." + o.Worker + "." + tail},
		events.StreamDLQ:      {events.DLQPrefix + "." + o.Worker + "." + tail},
	}}
	h.follow = k
	h.through = map[string]uint64{}
	for _, stream := range []string{events.StreamEvents, events.StreamOutcomes, events.StreamDLQ} {
		if err := h.read(ctx, js, stream, k.subjects[stream], o.Since, func(m jetstream.Msg, meta *jetstream.MsgMetadata) {
			if en, ok := k.entry(h, stream, m, meta); ok {
				h.add(en)
			}
		}); err != nil {
			return nil, err
		}
	}

	// Stored order across the three streams is the order of their store
	// times; within a stream, its sequence.
	kindOrder := map[string]int{EntryEvent: 0, EntryOutcome: 1, EntryDeadLetter: 2}
	slices.SortStableFunc(h.Entries, func(a, b Entry) int {
		return cmp.Or(a.Time.Compare(b.Time), cmp.Compare(kindOrder[a.Kind], kindOrder[b.Kind]), cmp.Compare(a.Sequence, b.Sequence))
	})
	return h, nil
}

// FollowHistory calls fn with every entry of h's key stored after h was
// read, as it is stored, until ctx ends (then it returns nil) or fn fails.
// It reads each stream with an ordered consumer from after the last
// message h read, so nothing is shown twice and nothing stored meanwhile
// is skipped. Entries of different streams come in the order they arrive;
// an outcome is still known by its causation once its event has come. A
// stream created after h was read is followed from its first message.
func FollowHistory(ctx context.Context, js jetstream.JetStream, h *History, fn func(Entry) error) error {
	if h.follow == nil {
		return errors.New("the history was not read by GetHistory, so there is nowhere to follow it from")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type arrival struct {
		stream string
		m      jetstream.Msg
	}
	arrived := make(chan arrival)
	failed := make(chan error, 3)
	for _, stream := range []string{events.StreamEvents, events.StreamOutcomes, events.StreamDLQ} {
		cfg := jetstream.OrderedConsumerConfig{FilterSubjects: h.follow.subjects[stream], InactiveThreshold: 5 * time.Second,
			DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: h.through[stream] + 1}
		go func() {
			failed <- followStream(ctx, js, stream, cfg, func(m jetstream.Msg) bool {
				select {
				case arrived <- arrival{stream, m}:
					return true
				case <-ctx.Done():
					return false
				}
			})
		}()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-failed:
			if err != nil && ctx.Err() == nil {
				return err
			}
		case a := <-arrived:
			meta, err := a.m.Metadata()
			if err != nil {
				return fmt.Errorf("follow %s: %w", a.stream, err)
			}
			h.through[a.stream] = meta.Sequence.Stream
			en, ok := h.follow.entry(h, a.stream, a.m, meta)
			if !ok {
				continue
			}
			if en.Forged != "" {
				h.Forged++
			}
			if err := fn(en); err != nil {
				return err
			}
		}
	}
}

// followStream hands each message of an ordered consumer to give until
// ctx ends or give says stop. A stream that does not exist yet is waited
// for: the first worker or setup makes it.
func followStream(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.OrderedConsumerConfig, give func(jetstream.Msg) bool) error {
	var s jetstream.Stream
	for {
		var err error
		s, err = js.Stream(ctx, stream)
		if err == nil {
			break
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("follow %s: %w", stream, err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
	cons, err := s.OrderedConsumer(ctx, cfg)
	if err != nil {
		return fmt.Errorf("follow %s: %w", stream, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("follow %s: %w", stream, err)
	}
	// Next blocks until a message comes; stopping the iterator when ctx
	// ends is what returns it.
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return fmt.Errorf("follow %s: %w", stream, err)
		}
		if !give(m) {
			return nil
		}
	}
}

// add appends an entry and counts it when it is forged.
func (h *History) add(en Entry) {
	if en.Forged != "" {
		h.Forged++
	}
	h.Entries = append(h.Entries, en)
}

// read calls fn for every message of the subjects of a stream, and
// records how far it read (through) for FollowHistory, and the stream's
// sources for checking its messages' proofs. A missing stream reads as
// empty.
func (h *History) read(ctx context.Context, js jetstream.JetStream, stream string, subjects []string, since time.Time,
	fn func(m jetstream.Msg, meta *jetstream.MsgMetadata)) error {
	s, err := streamOrNone(ctx, js, stream)
	if err != nil || s == nil {
		return err
	}
	// Where a follower starts: after the last message read, and never
	// before the stream's last one now, so a follower of a history whose
	// range held nothing does not go back over what --since left out.
	h.through[stream] = s.CachedInfo().State.LastSeq
	h.follow.o.Proofs = h.follow.o.Proofs.sourcedBy(s.CachedInfo())
	err = streamread.Each(ctx, js, streamread.Range{Stream: stream, Subjects: subjects, StartTime: since}, func(m jetstream.Msg) error {
		meta, err := m.Metadata()
		if err != nil {
			return err
		}
		h.through[stream] = max(h.through[stream], meta.Sequence.Stream)
		fn(m, meta)
		return nil
	})
	if err != nil {
		return fmt.Errorf("read %s: %w", stream, err)
	}
	return nil
}

// keyReader turns the stored messages of a key's subjects into history
// entries: GetHistory's read and FollowHistory's share it, so a followed
// entry is what a later history would show.
type keyReader struct {
	o HistoryOptions
	// subjects are the subjects read of each stream.
	subjects map[string][]string
	// ids are the key's events read so far: outcomes and letters are the
	// key's when their causation names one, or their key is the key.
	ids map[string]bool
}

// entry is the entry of a message of stream, or false when it is not of
// the key. A message that is not an event is recorded in h.Unreadable.
func (k *keyReader) entry(h *History, stream string, m jetstream.Msg, meta *jetstream.MsgMetadata) (Entry, bool) {
	if stream == events.StreamDLQ {
		d := events.ParseDeadLetter(meta.Sequence.Stream, m.Subject(), m.Headers(), m.Data())
		key := ""
		if d.Event != nil {
			key = d.Event.Subject()
		}
		if !k.ids[d.EventID()] && key != k.o.Key {
			return Entry{}, false
		}
		en := Entry{Kind: EntryDeadLetter, Stream: events.StreamDLQ, Sequence: d.DLQSequence, Subject: d.DLQSubject,
			Time: meta.Timestamp.UTC(), ID: d.EventID(), Key: key, CausationID: d.EventID(),
			Instance: lastToken(d.DLQSubject), Reason: redact.Line(d.Reason)}
		if d.Event != nil {
			en.Type, en.TraceID = d.Event.Type(), traceID(*d.Event)
		}
		en.Forged, en.Unverified = k.o.Proofs.letter(d, meta.Timestamp)
		return en, true
	}
	e, err := events.Decode(m.Headers(), m.Data())
	if err != nil {
		h.Unreadable = append(h.Unreadable, Unreadable{Stream: stream, Sequence: meta.Sequence.Stream, Subject: m.Subject(), Error: redact.Line(err.Error())})
		return Entry{}, false
	}
	if stream == events.StreamEvents {
		if e.Subject() != k.o.Key {
			return Entry{}, false
		}
		k.ids[e.ID()] = true
		return entryOf(EntryEvent, events.StreamEvents, meta, m.Subject(), e), true
	}
	cause, _ := e.Extensions()["causationid"].(string)
	if !k.ids[cause] && e.Subject() != k.o.Key {
		return Entry{}, false
	}
	subject := m.Subject()
	en := entryOf(EntryOutcome, events.StreamOutcomes, meta, subject, e)
	en.CausationID = cause
	en.Instance = lastToken(subject)
	en.Outcome = outcomeName(e.Type())
	en.Replay = isReplay(e)
	en.Rule, en.Reason, en.SupersededBy = outcomeWhy(e)
	en.Forged, en.Unverified = k.o.Proofs.outcome(subject, meta.Timestamp, m.Headers(), m.Data(), e)
	return en, true
}

// keySubjects are the event subjects a worker reads that may hold key's
// events: the key's own subject for kinds keyed by subject, the shared
// subject otherwise (filtered by the subject attribute afterwards).
func keySubjects(worker, key string) ([]string, error) {
	types, ok := workerTypes[worker]
	if !ok {
		for _, k := range events.Kinds() {
			types = append(types, k.Type)
		}
	}
	var subjects []string
	for _, t := range types {
		k, _ := events.Lookup(t)
		if k.KeyInSubject && k.CheckKey(key) != nil {
			continue // no event of this kind can have that key
		}
		s := k.FilterSubject(key)
		if !k.KeyInSubject {
			s = k.Subject
		}
		if !slices.Contains(subjects, s) {
			subjects = append(subjects, s)
		}
	}
	if len(subjects) == 0 {
		return nil, fmt.Errorf("key %q is not a key any event of the %s worker can have", key, worker)
	}
	return subjects, nil
}

// entryOf is the entry of a stored event. Its time is when the server
// stored it: the one clock the three streams share (an event's own time
// attribute is whatever its publisher said).
func entryOf(kind, stream string, meta *jetstream.MsgMetadata, subject string, e event.Event) Entry {
	return Entry{Kind: kind, Stream: stream, Sequence: meta.Sequence.Stream, Subject: subject, Time: meta.Timestamp.UTC(),
		ID: e.ID(), Type: e.Type(), Key: e.Subject(), TraceID: traceID(e)}
}

// traceID reads the trace id from a W3C traceparent extension
// (00-<trace id>-<span id>-<flags>).
func traceID(e event.Event) string {
	tp, _ := e.Extensions()["traceparent"].(string)
	parts := strings.Split(tp, "-")
	if len(parts) != 4 || len(parts[1]) != 32 {
		return ""
	}
	return parts[1]
}

// outcomeWhy reads why an outcome is what it is from its data: the rule
// and reason of a refusal ({rule, reason}, every worker's refused outcome)
// and the superseding event of a superseded one (events.Superseded). Data
// that is not a JSON object, or fields that are not strings, read as none:
// the data was written by whoever could publish, and the entry is listed
// either way. The rule is a worker's constant, but the reason quotes what
// was found, so both are elided and kept on one line.
func outcomeWhy(e event.Event) (rule, reason, supersededBy string) {
	var why struct {
		Rule         any `json:"rule"`
		Reason       any `json:"reason"`
		SupersededBy any `json:"supersededBy"`
	}
	if json.Unmarshal(e.Data(), &why) != nil {
		return "", "", ""
	}
	str := func(v any) string {
		s, _ := v.(string)
		return redact.Line(s)
	}
	return str(why.Rule), str(why.Reason), str(why.SupersededBy)
}

// isReplay says whether an outcome was emitted by a replay
// (events.ReplayExtension).
func isReplay(e event.Event) bool {
	switch v := e.Extensions()["replay"].(type) {
	case bool:
		return v
	case string:
		return v == "true"
	}
	return false
}

// outcomeName is the <outcome> of dev.steward.<noun>.<outcome>.v1.
func outcomeName(typ string) string {
	parts := strings.Split(typ, ".")
	if len(parts) < 5 {
		return ""
	}
	return parts[len(parts)-2]
}

func lastToken(subject string) string {
	return subject[strings.LastIndexByte(subject, '.')+1:]
}
