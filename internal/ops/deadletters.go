package ops

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/redact"
	"github.com/steward-dev/steward/internal/streamread"
)

// Dead letters: the whole lifecycle of STEWARD_DLQ (list, show, retry,
// remove, purge), for `steward dlq` and the console alike. Every action
// is one call here, so both act the same way, leave the same audit line
// and keep the same safety rules:
//
//   - a retry republishes only to the subject the decoded, re-validated
//     event maps to, never to a subject the letter names, and never to
//     $JS., $KV., $SYS., $O. or _INBOX.;
//   - a letter whose Steward-Worker header and DLQ subject disagree,
//     whose content does not match its digest, or whose proof does not
//     verify as its instance's (it was forged, docs/design.md §7), is
//     refused and kept;
//   - a republish JetStream reports as a duplicate of anything but this
//     very event stored nothing, so the letter is kept;
//   - letters of one key are retried in the order their originals were
//     stored, and a refused one holds back the later ones of its key;
//   - a removal deletes exactly the sequences the filter matched (a
//     stream never reuses a sequence), and a purge deletes nothing stored
//     after the letters it read.

// Letter is one dead letter as an operator sees it: where and when it was
// stored, what event it holds and why it is dead. Every text field is as
// the bus holds it, except Reason, whose secrets are elided; escape them
// before printing them to a terminal.
type Letter struct {
	// Sequence is the letter's sequence in STEWARD_DLQ, Subject the
	// subject it was stored on (steward.dlq.<worker>.<instance>).
	Sequence uint64 `json:"sequence"`
	Subject  string `json:"subject"`
	// Time is when STEWARD_DLQ stored the letter: the time filters and
	// listings use (the event's own time is whatever its publisher said).
	Time time.Time `json:"time"`
	// WorkerName and Instance are read from Subject. Consumer is the
	// letter's Steward-Worker header; WorkerMismatch is set when the two
	// disagree (the letter was not written by the worker it names, and
	// is never retried).
	WorkerName     string `json:"worker"`
	Instance       string `json:"instance"`
	Consumer       string `json:"consumer"`
	WorkerMismatch bool   `json:"workerMismatch,omitempty"`
	// EventID, Type and Key are the original event's, read from the
	// decoded event or, when it does not decode (a truncated letter), its
	// ce-* headers; "" when neither says.
	EventID string `json:"eventId"`
	Type    string `json:"type,omitempty"`
	Key     string `json:"key,omitempty"`
	// EventTime is the event's time attribute, when it decodes.
	EventTime *time.Time `json:"eventTime,omitempty"`
	// Reason is why it is dead (Steward-Error), secrets elided.
	Reason string `json:"reason"`
	// Deliveries is how many deliveries the original had.
	Deliveries int `json:"deliveries"`
	// Original locates the event the letter was made from.
	Original Original `json:"original"`
	// Readable says the letter holds a CloudEvent that decodes.
	Readable bool `json:"readable"`
	// Truncated says the letter holds only the start of the original's
	// data (OriginalSize bytes in all); a retry reads the original.
	Truncated    bool `json:"truncated,omitempty"`
	OriginalSize int  `json:"originalSize,omitempty"`
	// Forged says why the letter is not believed: it carries no proof,
	// or one that does not verify as the instance its DLQ subject names.
	// Someone made the bus store it; a retry refuses it.
	Forged string `json:"forged,omitempty"`
	// Unverified says the letter could not be checked: the reader had no
	// document keys, or it was stored unsigned before the upgrade record,
	// by the version before proofs.
	Unverified bool `json:"unverified,omitempty"`

	// Raw is the parsed letter, for the actions; never printed whole.
	Raw events.DeadLetter `json:"-"`
}

// Original is where the event a dead letter was made from is stored.
type Original struct {
	Stream   string `json:"stream"`
	Sequence uint64 `json:"sequence"`
	Subject  string `json:"subject"`
	Digest   string `json:"digest,omitempty"`
}

// LetterDetail is one letter with its headers and data, secrets elided,
// for `steward dlq show` and the console's letter page.
type LetterDetail struct {
	Letter
	// Check says whether the letter proves its content: "verified",
	// "unverifiable: …" (older letters, truncated ones: the original is
	// checked at retry) or "altered: …" (a retry refuses it).
	Check   string   `json:"check"`
	Headers []Header `json:"headers"`
	// Data is the letter's data as pretty JSON with every secret-named
	// field and armored block elided (ElideData), or quoted when it is not
	// JSON.
	Data string `json:"data"`
}

// Header is one header of a dead letter, its value's secrets elided.
type Header struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// LetterList is what a filter selected.
type LetterList struct {
	Server  string   `json:"server"`
	Letters []Letter `json:"letters"`
	// through is the last STEWARD_DLQ sequence ListLetters read, where
	// FollowLetters goes on from.
	through uint64
	filter  LetterFilter
	proofs  Proofs
	read    bool
}

// LetterFilter selects dead letters; every field set must match. The zero
// value selects every letter.
type LetterFilter struct {
	// Worker is a worker name (credential) or a consumer (credential-h1),
	// matched on the letter's DLQ subject, the one part of a letter its
	// writer's permissions vouch for.
	Worker string `json:"worker,omitempty"`
	// Type is the original event's CloudEvents type.
	Type string `json:"type,omitempty"`
	// Key is the original event's key.
	Key string `json:"key,omitempty"`
	// Reason keeps letters whose reason holds this text, in any case.
	Reason string `json:"reason,omitempty"`
	// Since and Until bound the time STEWARD_DLQ stored the letter:
	// Since <= time < Until; zero is unbounded.
	Since time.Time `json:"since,omitzero"`
	Until time.Time `json:"until,omitzero"`
	// Seqs are STEWARD_DLQ sequences; nil is every sequence.
	Seqs []uint64 `json:"seqs,omitempty"`
}

// Empty says f selects every letter.
func (f LetterFilter) Empty() bool {
	return f.Worker == "" && f.Type == "" && f.Key == "" && f.Reason == "" && f.Since.IsZero() && f.Until.IsZero() && f.Seqs == nil
}

// Match says whether f selects l.
func (f LetterFilter) Match(l Letter) bool {
	switch {
	case f.Seqs != nil && !slices.Contains(f.Seqs, l.Sequence):
		return false
	case f.Worker != "" && f.Worker != l.WorkerName && f.Worker != l.WorkerName+"-"+l.Instance:
		return false
	case f.Type != "" && f.Type != l.Type:
		return false
	case f.Key != "" && f.Key != l.Key:
		return false
	case f.Reason != "" && !strings.Contains(strings.ToLower(l.Reason), strings.ToLower(f.Reason)):
		return false
	case !f.Since.IsZero() && l.Time.Before(f.Since):
		return false
	case !f.Until.IsZero() && !l.Time.Before(f.Until):
		return false
	}
	return true
}

// dlqSubjects are the DLQ subjects that can hold letters a worker filter
// selects, so the server sends only those: steward.dlq.<name>.* for a
// name, and steward.dlq.<name>.<instance> for every way a consumer splits
// at a '-' (a worker name may hold one too). Match still decides.
func (f LetterFilter) dlqSubjects() []string {
	if f.Worker == "" {
		return nil
	}
	out := []string{events.DLQPrefix + "." + f.Worker + ".*"}
	for i := range len(f.Worker) {
		if f.Worker[i] == '-' && i > 0 && i < len(f.Worker)-1 {
			out = append(out, events.DLQSubject(f.Worker[:i], f.Worker[i+1:]))
		}
	}
	return out
}

func (f LetterFilter) check() error {
	if f.Worker != "" && events.CheckKey(f.Worker) != nil {
		return fmt.Errorf("worker %q is neither a worker name nor a consumer (credential, credential-h1): check it with `steward status`", f.Worker)
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return fmt.Errorf("the time range from %s until %s is empty: give a since before the until", f.Since.UTC().Format(time.RFC3339), f.Until.UTC().Format(time.RFC3339))
	}
	return nil
}

// LetterOf reads a message of STEWARD_DLQ as a Letter. It never fails: a
// field the message does not say is left zero.
func LetterOf(seq uint64, subject string, stored time.Time, h nats.Header, data []byte) Letter {
	d := events.ParseDeadLetter(seq, subject, h, data)
	l := Letter{Sequence: seq, Subject: subject, Time: stored.UTC(), Consumer: d.Worker, EventID: d.EventID(),
		Reason: redact.Secrets(d.Reason), Deliveries: d.Delivered, Readable: d.Event != nil, Truncated: d.Truncated,
		Original: Original{Stream: cmp.Or(d.Stream, events.StreamEvents), Sequence: d.Sequence, Subject: d.Subject, Digest: d.Digest},
		Raw:      d}
	if d.Truncated {
		l.OriginalSize = d.OriginalSize
	}
	l.WorkerName, l.Instance = splitDLQSubject(subject)
	l.WorkerMismatch = d.CheckWorker() != nil
	if d.Event != nil {
		l.Type, l.Key = d.Event.Type(), d.Event.Subject()
		if t := d.Event.Time(); !t.IsZero() {
			t = t.UTC()
			l.EventTime = &t
		}
	} else {
		l.Type, l.Key = headerValue(h, "ce-type"), headerValue(h, "ce-subject")
	}
	return l
}

// headerValue reads a header case-insensitively, as the codec does.
func headerValue(h nats.Header, name string) string {
	for k, v := range h {
		if strings.EqualFold(k, name) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

// splitDLQSubject reads steward.dlq.<worker>.<instance>.
func splitDLQSubject(s string) (worker, instance string) {
	rest, ok := strings.CutPrefix(s, events.DLQPrefix+".")
	if !ok {
		return "", ""
	}
	worker, instance, _ = strings.Cut(rest, ".")
	return worker, instance
}

// ListLetters returns the dead letters f selects, in DLQ order, each
// checked with p (Letter.Forged, Letter.Unverified). A filter of
// sequences reads only those (a sequence that holds no letter is left out);
// one of a worker reads only its DLQ subjects, and one with Since starts
// at that time.
func ListLetters(ctx context.Context, js jetstream.JetStream, f LetterFilter, p Proofs) (*LetterList, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	out := &LetterList{Server: ServerURL(js), Letters: []Letter{}}
	s, err := streamOrNone(ctx, js, events.StreamDLQ)
	if err != nil {
		return nil, err
	}
	if s == nil {
		return nil, &NoStreamsError{Server: out.Server}
	}
	p = p.sourcedBy(s.CachedInfo())
	if f.Seqs != nil {
		for _, seq := range f.Seqs {
			l, err := GetLetter(ctx, js, seq, p)
			if errors.Is(err, ErrNoLetter) {
				continue
			}
			if err != nil {
				return nil, err
			}
			if f.Match(l) {
				out.Letters = append(out.Letters, l)
			}
		}
		return out, nil
	}
	err = streamread.Each(ctx, js, streamread.Range{Stream: events.StreamDLQ, Subjects: f.dlqSubjects(), StartTime: f.Since}, func(m jetstream.Msg) error {
		meta, err := m.Metadata()
		if err != nil {
			return err
		}
		out.through = meta.Sequence.Stream
		if l := LetterOf(meta.Sequence.Stream, m.Subject(), meta.Timestamp, m.Headers(), m.Data()); f.Match(l) {
			l.Forged, l.Unverified = p.letter(l.Raw, meta.Timestamp)
			out.Letters = append(out.Letters, l)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read %s on %s: %w", events.StreamDLQ, out.Server, err)
	}
	out.filter, out.proofs, out.read = f, p, true
	return out, nil
}

// FollowLetters hands fn each dead letter stored after the ones list holds
// that list's filter selects, checked as ListLetters checks them, until
// ctx ends (nil) or fn fails. It goes on from the last message ListLetters
// read, so nothing is shown twice and nothing stored meanwhile is skipped.
// A list of chosen sequences has nothing to follow.
func FollowLetters(ctx context.Context, js jetstream.JetStream, list *LetterList, fn func(Letter) error) error {
	switch {
	case !list.read:
		return errors.New("the dead letters were not read by ListLetters over the stream, so there is nowhere to follow them from")
	case list.filter.Seqs != nil:
		return errors.New("a list of chosen sequences has nothing to follow: list by filters to follow new dead letters")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	arrived := make(chan jetstream.Msg)
	failed := make(chan error, 1)
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: list.filter.dlqSubjects(), InactiveThreshold: 5 * time.Second,
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: list.through + 1}
	go func() {
		failed <- followStream(ctx, js, events.StreamDLQ, cfg, func(m jetstream.Msg) bool {
			select {
			case arrived <- m:
				return true
			case <-ctx.Done():
				return false
			}
		})
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-failed:
			if ctx.Err() != nil {
				return nil
			}
			if err == nil {
				err = errors.New("the server ended the follow")
			}
			return err
		case m := <-arrived:
			meta, err := m.Metadata()
			if err != nil {
				return fmt.Errorf("follow %s: %w", events.StreamDLQ, err)
			}
			list.through = meta.Sequence.Stream
			l := LetterOf(meta.Sequence.Stream, m.Subject(), meta.Timestamp, m.Headers(), m.Data())
			if !list.filter.Match(l) {
				continue
			}
			l.Forged, l.Unverified = list.proofs.letter(l.Raw, meta.Timestamp)
			if err := fn(l); err != nil {
				return err
			}
		}
	}
}

// ErrNoLetter says a STEWARD_DLQ sequence holds no letter: it was retried,
// removed or purged, or never existed.
var ErrNoLetter = errors.New("no dead letter at that sequence")

// GetLetter returns the letter at a STEWARD_DLQ sequence, checked with p.
func GetLetter(ctx context.Context, js jetstream.JetStream, seq uint64, p Proofs) (Letter, error) {
	s, err := js.Stream(ctx, events.StreamDLQ)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return Letter{}, &NoStreamsError{Server: ServerURL(js)}
	}
	if err != nil {
		return Letter{}, fmt.Errorf("look up stream %s on %s: %w", events.StreamDLQ, ServerURL(js), err)
	}
	p = p.sourcedBy(s.CachedInfo())
	m, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Letter{}, fmt.Errorf("%w: %s sequence %d holds nothing (retried, removed or purged already?); list what is there with `steward dlq ls`", ErrNoLetter, events.StreamDLQ, seq)
	}
	if err != nil {
		return Letter{}, fmt.Errorf("read dead letter %d: %w", seq, err)
	}
	l := LetterOf(m.Sequence, m.Subject, m.Time, m.Header, m.Data)
	l.Forged, l.Unverified = p.letter(l.Raw, m.Time)
	return l, nil
}

// Detail is l with its headers and data, secrets elided.
func Detail(l Letter) LetterDetail {
	d := LetterDetail{Letter: l, Headers: []Header{}, Data: ElideData(l.Raw.Data, l.Raw.Truncated)}
	switch err := l.Raw.Verify(); {
	case err == nil:
		d.Check = "verified"
	case errors.Is(err, events.ErrLetterUnverifiable):
		d.Check = "unverifiable: " + redact.Secrets(err.Error())
	default:
		d.Check = "altered: " + redact.Secrets(err.Error())
	}
	for k, vs := range l.Raw.Headers {
		for _, v := range vs {
			d.Headers = append(d.Headers, Header{Name: k, Value: redact.Secrets(v)})
		}
	}
	slices.SortStableFunc(d.Headers, func(a, b Header) int { return strings.Compare(a.Name, b.Name) })
	return d
}

// secretFields are data fields whose value is never shown, whatever it
// holds: a letter may be dead because a plaintext was pasted where the
// ciphertext belongs.
var secretFields = []string{"secret", "password", "token", "privatekey", "identity"}

// ElideData is a dead letter's data (or a saved stage) as an operator sees
// it: pretty JSON with every secret-named field's value replaced by
// "[elided]", then any armored block or age identity elided (Elide)
// wherever it is. Data that is not JSON is shown quoted, elided the same
// way.
func ElideData(data []byte, truncated bool) string {
	var v any
	if !truncated && json.Unmarshal(data, &v) == nil {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		if enc.Encode(elideValue(v)) == nil {
			return redact.Secrets(strings.TrimSuffix(buf.String(), "\n"))
		}
	}
	return redact.Secrets(strconv.Quote(string(data)))
}

func elideValue(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			if slices.ContainsFunc(secretFields, func(s string) bool { return strings.Contains(strings.ToLower(k), s) }) {
				x[k] = "[elided]"
				continue
			}
			x[k] = elideValue(val)
		}
	case []any:
		for i := range x {
			x[i] = elideValue(x[i])
		}
	}
	return v
}

// The actions, and the results an action has on one letter.
const (
	ActionRetry  = "retry"
	ActionRemove = "remove"
	ActionPurge  = "purge"

	// ResultRetried: the event was republished (or an earlier retry had
	// stored it) and the letter removed.
	ResultRetried = "retried"
	// ResultRemoved and ResultPurged: the letter was deleted, its event
	// not republished.
	ResultRemoved = "removed"
	ResultPurged  = "purged"
	// ResultRefused: the action was refused and the letter kept; Error
	// says why and what to do.
	ResultRefused = "refused"
	// ResultHeld: an earlier letter of the same key was refused, so this
	// one was kept to keep the key's order.
	ResultHeld = "held"
	// ResultGone: the letter was no longer there (another operator, or
	// another window, dealt with it first).
	ResultGone = "gone"
)

// Result is what an action did to one letter.
type Result struct {
	Action   string `json:"action"`
	Sequence uint64 `json:"sequence"`
	EventID  string `json:"eventId,omitempty"`
	Worker   string `json:"worker"`
	Instance string `json:"instance"`
	Key      string `json:"key,omitempty"`
	Type     string `json:"type,omitempty"`
	Result   string `json:"result"`
	// Republished is where a retry stored the event: its subject and its
	// new STEWARD_EVENTS sequence. Already says an earlier retry had
	// stored it and this one only removed the letter.
	Subject     string `json:"subject,omitempty"`
	NewSequence uint64 `json:"newSequence,omitempty"`
	Already     bool   `json:"already,omitempty"`
	// Error is why the letter was refused, held or gone, secrets elided.
	Error string `json:"error,omitempty"`
	// AuditError says the audit event could not be stored (the action
	// itself was done, and the audit line logged).
	AuditError string `json:"auditError,omitempty"`
}

// OK says the action was done.
func (r Result) OK() bool {
	return r.Result == ResultRetried || r.Result == ResultRemoved || r.Result == ResultPurged
}

// Report is what an action did to every letter it was given, in the order
// it acted.
type Report struct {
	Action  string   `json:"action"`
	Results []Result `json:"results"`
	// Done counts the letters retried, removed or purged; Refused, Held
	// and Gone the others.
	Done    int `json:"done"`
	Refused int `json:"refused"`
	Held    int `json:"held"`
	Gone    int `json:"gone"`
}

func (r *Report) add(res Result) {
	r.Results = append(r.Results, res)
	switch res.Result {
	case ResultRefused:
		r.Refused++
	case ResultHeld:
		r.Held++
	case ResultGone:
		r.Gone++
	default:
		r.Done++
	}
}

// Err is nil when every letter was acted on or was gone already, and
// otherwise says how many were kept and what the operator does next.
func (r *Report) Err() error {
	if r.Refused+r.Held == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d dead letters were kept in %s (%d refused, %d held behind a refused letter of their key): fix what each refusal names, then %s them again",
		r.Refused+r.Held, len(r.Results), events.StreamDLQ, r.Refused, r.Held, r.Action)
}

// ActOptions are what every action takes.
type ActOptions struct {
	// Log receives the audit line of every letter acted on: action,
	// result, DLQ sequence, event id, worker, instance and, for a retry,
	// where the event went. The zero value discards.
	Log zerolog.Logger
	// Actor names who acted, in the audit line and event ("steward dlq",
	// "console").
	Actor string
	// NoAuditEvents leaves out the audit events (AuditSubject); the audit
	// lines are always logged.
	NoAuditEvents bool
	// OnResult, when set, is called after each letter, for progress.
	OnResult func(Result)
	// Now is the clock (default time.Now).
	Now func() time.Time
}

func (o *ActOptions) now() time.Time {
	if o.Now != nil {
		return o.Now()
	}
	return time.Now()
}

// AuditNoun is the noun of audit events: their types are
// dev.steward.dlq.<result>.v1 (retried, removed, purged).
const AuditNoun = "dlq"

// AuditSubject is where the audit event of an action on a letter of a
// worker instance goes: steward.outcomes.dlq.<worker>.<instance>. It is
// in STEWARD_OUTCOMES, kept for audits like the workers' outcomes, on a
// subject no worker may write (no worker is named dlq, and a worker's
// outcomes have one token fewer), so only an operator can have written it.
func AuditSubject(worker, instance string) string {
	return events.OutcomesPrefix + "." + AuditNoun + "." + worker + "." + instance
}

// AuditData is the data of an audit event.
type AuditData struct {
	Action      string `json:"action"`
	Result      string `json:"result"`
	Actor       string `json:"actor,omitempty"`
	DLQSequence uint64 `json:"dlqSequence"`
	Consumer    string `json:"consumer"`
	EventID     string `json:"eventId,omitempty"`
	EventType   string `json:"eventType,omitempty"`
	Reason      string `json:"reason,omitempty"`
	Subject     string `json:"subject,omitempty"`
	NewSequence uint64 `json:"newSequence,omitempty"`
}

// audit logs the audit line of res and, for an action done, stores its
// audit event. The line is the record an operator's log keeps; the event
// is the one consoles and audits read from the bus.
func (o *ActOptions) audit(ctx context.Context, js jetstream.JetStream, l Letter, res *Result) {
	if res.OK() && !o.NoAuditEvents && l.WorkerName != "" && events.CheckKey(l.WorkerName) == nil && events.CheckKey(l.Instance) == nil {
		if err := o.auditEvent(ctx, js, l, *res); err != nil {
			res.AuditError = redact.Secrets(err.Error())
		}
	}
	ev := o.Log.Info()
	if !res.OK() && res.Result != ResultGone {
		ev = o.Log.Warn()
	}
	ev = ev.Str("audit", "dlq").Str("action", res.Action).Str("result", res.Result).
		Uint64("dlq_seq", res.Sequence).Str("event_id", Printable(res.EventID)).
		Str("worker", Printable(l.Consumer)).Str("dlq_subject", Printable(l.Subject))
	if o.Actor != "" {
		ev = ev.Str("actor", o.Actor)
	}
	if res.Subject != "" {
		ev = ev.Str("subject", res.Subject).Uint64("new_seq", res.NewSequence).Bool("already", res.Already)
	}
	if res.Error != "" {
		ev = ev.Str("error", Printable(res.Error))
	}
	if res.AuditError != "" {
		ev = ev.Str("audit_error", Printable(res.AuditError))
	}
	ev.Msg("dead letter " + res.Action + ": " + res.Result)
	if o.OnResult != nil {
		o.OnResult(*res)
	}
}

func (o *ActOptions) auditEvent(ctx context.Context, js jetstream.JetStream, l Letter, res Result) error {
	e := event.New()
	// One id per letter and result, so an audit event published again
	// after a crash is stored once.
	e.SetID("dlq-" + strconv.FormatUint(l.Sequence, 10) + "-" + res.Result)
	e.SetType(events.OutcomeType(AuditNoun, res.Result))
	e.SetSource("/steward/dlq")
	if events.CheckKey(l.Key) == nil {
		e.SetSubject(l.Key)
	}
	e.SetTime(o.now().UTC())
	if l.EventID != "" {
		e.SetExtension("causationid", l.EventID)
	}
	data := AuditData{Action: res.Action, Result: res.Result, Actor: o.Actor, DLQSequence: l.Sequence, Consumer: l.Consumer,
		EventID: l.EventID, EventType: l.Type, Reason: l.Reason, Subject: res.Subject, NewSequence: res.NewSequence}
	if err := e.SetData(events.ContentTypeJSON, data); err != nil {
		return err
	}
	msg, err := events.Encode(AuditSubject(l.WorkerName, l.Instance), e)
	if err != nil {
		return err
	}
	if _, err := js.PublishMsg(ctx, msg, jetstream.WithExpectStream(events.StreamOutcomes)); err != nil {
		return fmt.Errorf("store the audit event on %s: %w (the action was done; its audit line is in the log)", msg.Subject, err)
	}
	return nil
}

func resultOf(action string, l Letter) Result {
	return Result{Action: action, Sequence: l.Sequence, EventID: l.EventID, Worker: l.WorkerName, Instance: l.Instance, Key: l.Key, Type: l.Type}
}

// DefaultRetryRate is the rate `steward dlq retry` and the console retry
// letters at: a backlog of letters comes back to the workers as a trickle
// they keep up with, not as one burst.
const DefaultRetryRate = 20

// RetryOptions are a retry's options.
type RetryOptions struct {
	ActOptions
	// Rate is how many letters a second are republished at most, so a
	// bulk retry does not flood the workers; 0 is unbounded.
	Rate float64
}

// RetryOrder sorts letters into the order a retry republishes them: by
// the original's stream and sequence (so every key's events are
// republished in the order they were first stored), then by DLQ
// sequence. Letters with no original sequence keep their DLQ order after
// the others.
func RetryOrder(list []Letter) []Letter {
	out := slices.Clone(list)
	slices.SortStableFunc(out, func(a, b Letter) int {
		return cmp.Or(
			cmp.Compare(boolInt(a.Original.Sequence == 0), boolInt(b.Original.Sequence == 0)),
			strings.Compare(a.Original.Stream, b.Original.Stream),
			cmp.Compare(a.Original.Sequence, b.Original.Sequence),
			cmp.Compare(a.Sequence, b.Sequence))
	})
	return out
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// laneOf is what orders letters in a retry: the worker instance, the
// event's type and key. "" for a letter that names no key: it orders
// nothing.
func (l Letter) lane() string {
	if l.Key == "" {
		return ""
	}
	return l.Subject + "\x00" + l.Type + "\x00" + l.Key
}

// RetryLetters republishes the letters' events in RetryOrder, at most
// o.Rate a second, and removes each letter once its event is stored. A
// letter that is refused holds back the later letters of its key (they
// are kept, ResultHeld), so a key's events are never republished out of
// order; the other keys go on. A letter gone since it was listed is
// skipped (ResultGone). The error is only for a retry that could not go
// on (ctx ended); what happened to each letter is in the Report.
func RetryLetters(ctx context.Context, js jetstream.JetStream, list []Letter, o RetryOptions) (*Report, error) {
	rep := &Report{Action: ActionRetry, Results: []Result{}}
	refused := map[string]uint64{}
	var wait pacer
	if o.Rate > 0 {
		wait.every = time.Duration(float64(time.Second) / o.Rate)
	}
	for _, l := range RetryOrder(list) {
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("the retry stopped after %d of %d dead letters: %w; the rest are still in %s, run it again", len(rep.Results), len(list), err, events.StreamDLQ)
		}
		res := resultOf(ActionRetry, l)
		lane := l.lane()
		if seq, ok := refused[lane]; ok && lane != "" {
			res.Result = ResultHeld
			res.Error = fmt.Sprintf("kept: dead letter %d of the same key (%s) was refused, and retrying this one first would apply the key's events out of order; fix that one, then retry both", seq, l.Key)
			o.audit(ctx, js, l, &res)
			rep.add(res)
			continue
		}
		if err := wait.wait(ctx); err != nil {
			return rep, fmt.Errorf("the retry stopped after %d of %d dead letters: %w; the rest are still in %s, run it again", len(rep.Results), len(list), err, events.StreamDLQ)
		}
		r, err := retryLetter(ctx, js, l)
		switch {
		case errors.Is(err, ErrNoLetter):
			res.Result, res.Error = ResultGone, redact.Secrets(err.Error())
		case err != nil:
			res.Result, res.Error = ResultRefused, redact.Secrets(err.Error())
			refused[lane] = l.Sequence
		default:
			res.Result, res.Subject, res.NewSequence, res.Already = ResultRetried, r.subject, r.seq, r.already
		}
		o.audit(ctx, js, l, &res)
		rep.add(res)
	}
	return rep, nil
}

// pacer spaces actions every apart; the zero value does not wait.
type pacer struct {
	every time.Duration
	next  time.Time
}

func (p *pacer) wait(ctx context.Context) error {
	if p.every <= 0 {
		return nil
	}
	now := time.Now()
	if d := p.next.Sub(now); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		now = p.next
	}
	p.next = now.Add(p.every)
	return nil
}

// retried is what a retry of one letter did.
type retried struct {
	event   event.Event
	subject string
	seq     uint64
	// already says the republish was a duplicate of this same event,
	// stored by an earlier retry that stopped before deleting the letter.
	already bool
}

// forbiddenPrefixes are subjects a retry never publishes to, whatever the
// event says: the JetStream and KV APIs, reply inboxes and the system
// account. The subject is derived from a validated event and always starts
// with steward.events., so this is a second lock, not the first.
var forbiddenPrefixes = []string{"$JS.", "$KV.", "$SYS.", "$O.", "_INBOX."}

// retryLetter republishes the event of l to the subject that event maps
// to and then deletes l. Its Nats-Msg-Id is derived from the letter's
// sequence and digest, so running the retry again after a crash between
// the two steps stores the event once (inside the dedupe window) and then
// deletes the letter. The letter is read again first: one removed since
// it was listed is not republished.
func retryLetter(ctx context.Context, js jetstream.JetStream, listed Letter) (retried, error) {
	if listed.Forged != "" {
		// Its instance did not write it: republishing it would put an
		// event of the forger's choosing in the stream as the operator's.
		// A stream never reuses a sequence, so the letter read again is
		// the one checked when it was listed.
		return retried{}, fmt.Errorf("dead letter %d is forged (%s); it was left in the DLQ: remove it with steward dlq rm %d once you have found who wrote it", listed.Sequence, listed.Forged, listed.Sequence)
	}
	l, err := GetLetter(ctx, js, listed.Sequence, Proofs{})
	if err != nil {
		return retried{}, err
	}
	d := l.Raw
	e, digest, err := letterEvent(ctx, js, d)
	if err != nil {
		return retried{}, err
	}
	k, _ := events.Lookup(e.Type())
	subject, err := k.SubjectFor(e.Subject())
	if err != nil {
		return retried{}, fmt.Errorf("dead letter %d: the event's key has no subject: %w; it was left in the DLQ", d.DLQSequence, err)
	}
	if !strings.HasPrefix(subject, events.EventsPrefix+".") || slices.ContainsFunc(forbiddenPrefixes, func(p string) bool { return strings.HasPrefix(subject, p) }) {
		return retried{}, fmt.Errorf("dead letter %d maps to %s, outside %s.>; it was left in the DLQ", d.DLQSequence, subject, events.EventsPrefix)
	}
	msg, err := events.Encode(subject, e)
	if err != nil {
		return retried{}, fmt.Errorf("dead letter %d: %w; it was left in the DLQ", d.DLQSequence, err)
	}
	id := RetryMsgID(d.DLQSequence, digest)
	msg.Header.Set(nats.MsgIdHdr, id)
	ack, err := js.PublishMsg(ctx, msg, jetstream.WithExpectStream(events.StreamEvents))
	if err != nil {
		return retried{}, fmt.Errorf("republish dead letter %d (event %s) to %s: %w; it was left in the DLQ", d.DLQSequence, e.ID(), subject, err)
	}
	r := retried{event: e, subject: subject, seq: ack.Sequence}
	if ack.Duplicate {
		// Nothing new was stored. Only if what JetStream holds under this
		// id is this very event may the letter go.
		if err := sameStored(ctx, js, ack.Sequence, id, msg); err != nil {
			return retried{}, fmt.Errorf("dead letter %d (event %s): JetStream reports the republish as a duplicate of %s sequence %d, and %w: nothing was stored, so the letter is kept; retry it again after the %s dedupe window", d.DLQSequence, e.ID(), events.StreamEvents, ack.Sequence, err, events.StreamEvents)
		}
		r.already = true
	}
	s, err := js.Stream(ctx, events.StreamDLQ)
	if err == nil {
		_, err = deleteLetter(ctx, s, d.DLQSequence)
	}
	if err != nil {
		return retried{}, fmt.Errorf("dead letter %d was republished at %s sequence %d but could not be deleted from the DLQ: %w; retry it again (within the dedupe window the event is not stored twice)", d.DLQSequence, events.StreamEvents, ack.Sequence, err)
	}
	return r, nil
}

// RetryMsgID is the Nats-Msg-Id of a retry of the letter at dlqSeq.
func RetryMsgID(dlqSeq uint64, digest string) string {
	d := strings.TrimPrefix(digest, "sha256:")
	if len(d) > 32 {
		d = d[:32]
	}
	return "steward-dlq-retry-" + strconv.FormatUint(dlqSeq, 10) + "-" + d
}

// letterEvent is the event a retry republishes, with the digest of the
// original it came from: the letter's own event when the letter is whole
// and matches its digest, or the original read by reference when the
// letter is truncated. The event is validated again, as a publisher would.
func letterEvent(ctx context.Context, js jetstream.JetStream, d events.DeadLetter) (event.Event, string, error) {
	if err := d.CheckWorker(); err != nil {
		return event.Event{}, "", fmt.Errorf("%w; it was left in the DLQ (remove it with `steward dlq rm %d` once you know who wrote it)", err, d.DLQSequence)
	}
	var e event.Event
	digest := d.Digest
	switch {
	case d.Truncated:
		orig, err := originalOf(ctx, js, d)
		if err != nil {
			return event.Event{}, "", err
		}
		e = orig
	case d.Event == nil:
		return event.Event{}, "", fmt.Errorf("dead letter %d does not hold a readable CloudEvent (it may be why it is dead): there is nothing to republish; publish a corrected event with steward publish, then remove the letter with `steward dlq rm %d`", d.DLQSequence, d.DLQSequence)
	default:
		if err := d.Verify(); err != nil && !errors.Is(err, events.ErrLetterUnverifiable) {
			return event.Event{}, "", fmt.Errorf("dead letter %d: %w; it was left in the DLQ", d.DLQSequence, err)
		}
		if digest == "" {
			// Written before letters carried digests.
			digest = events.LetterDigest(d.Subject, d.Headers, d.Data)
		}
		e = *d.Event
	}
	if err := events.Validate(e); err != nil {
		return event.Event{}, "", fmt.Errorf("dead letter %d (event %s) is still not a valid event: %w; it was left in the DLQ: fix the publisher and publish a corrected event", d.DLQSequence, e.ID(), err)
	}
	return e, digest, nil
}

// originalOf reads the original of a letter kept by reference and checks
// it is the one the letter names.
func originalOf(ctx context.Context, js jetstream.JetStream, d events.DeadLetter) (event.Event, error) {
	if d.Stream != events.StreamEvents {
		return event.Event{}, fmt.Errorf("dead letter %d refers to stream %q, not %s; it was left in the DLQ", d.DLQSequence, d.Stream, events.StreamEvents)
	}
	s, err := js.Stream(ctx, events.StreamEvents)
	if err != nil {
		return event.Event{}, fmt.Errorf("dead letter %d: stream %s: %w", d.DLQSequence, events.StreamEvents, err)
	}
	m, err := s.GetMsg(ctx, d.Sequence)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return event.Event{}, fmt.Errorf("dead letter %d is kept by reference, and %s sequence %d is gone (past retention?): there is nothing to republish; it was left in the DLQ", d.DLQSequence, events.StreamEvents, d.Sequence)
	}
	if err != nil {
		return event.Event{}, fmt.Errorf("dead letter %d: read its original at %s sequence %d: %w", d.DLQSequence, events.StreamEvents, d.Sequence, err)
	}
	if err := d.VerifyOriginal(m.Subject, m.Header, m.Data); err != nil {
		return event.Event{}, fmt.Errorf("dead letter %d: %w; it was left in the DLQ", d.DLQSequence, err)
	}
	e, err := events.Decode(m.Header, m.Data)
	if err != nil {
		return event.Event{}, fmt.Errorf("dead letter %d: its original does not decode: %w; it was left in the DLQ", d.DLQSequence, err)
	}
	return e, nil
}

// sameStored checks that the message at seq in STEWARD_EVENTS is the
// republish msg under id: the same subject, id and encoded event.
func sameStored(ctx context.Context, js jetstream.JetStream, seq uint64, id string, msg *nats.Msg) error {
	s, err := js.Stream(ctx, events.StreamEvents)
	if err != nil {
		return fmt.Errorf("it could not be read back: %w", err)
	}
	m, err := s.GetMsg(ctx, seq)
	if err != nil {
		return fmt.Errorf("it could not be read back: %w", err)
	}
	if m.Subject != msg.Subject || m.Header.Get(nats.MsgIdHdr) != id || !bytes.Equal(m.Data, msg.Data) ||
		events.LetterDigest(m.Subject, m.Header, m.Data) != events.LetterDigest(msg.Subject, msg.Header, msg.Data) {
		return errors.New("the message stored there is not this event")
	}
	return nil
}

// deleteLetter deletes the letter at seq; gone says it was not there. The
// server's answer to deleting a missing message reaches nats.go only as
// text (ErrMsgDeleteUnsuccessful), so a failed delete is checked by
// reading the sequence back.
func deleteLetter(ctx context.Context, s jetstream.Stream, seq uint64) (gone bool, err error) {
	err = s.DeleteMsg(ctx, seq)
	if err == nil {
		return false, nil
	}
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return true, nil
	}
	if _, gerr := s.GetMsg(ctx, seq); errors.Is(gerr, jetstream.ErrMsgNotFound) {
		return true, nil
	}
	return false, err
}

// RemoveLetters deletes the letters from STEWARD_DLQ without republishing
// their events. It deletes exactly their sequences (a stream never reuses
// one, so nothing stored since they were listed can be hit); a letter
// already gone is reported as such.
func RemoveLetters(ctx context.Context, js jetstream.JetStream, list []Letter, o ActOptions) (*Report, error) {
	rep := &Report{Action: ActionRemove, Results: []Result{}}
	s, err := js.Stream(ctx, events.StreamDLQ)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, &NoStreamsError{Server: ServerURL(js)}
	}
	if err != nil {
		return nil, fmt.Errorf("look up stream %s on %s: %w", events.StreamDLQ, ServerURL(js), err)
	}
	for _, l := range list {
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("the removal stopped after %d of %d dead letters: %w; the rest are still in %s", len(rep.Results), len(list), err, events.StreamDLQ)
		}
		res := resultOf(ActionRemove, l)
		switch gone, err := deleteLetter(ctx, s, l.Sequence); {
		case gone:
			res.Result, res.Error = ResultGone, fmt.Sprintf("%s sequence %d holds nothing: it was retried or removed already", events.StreamDLQ, l.Sequence)
		case err != nil:
			res.Result, res.Error = ResultRefused, redact.Secrets(fmt.Sprintf("remove dead letter %d: %v; it is still in %s, try again", l.Sequence, err, events.StreamDLQ))
		default:
			res.Result = ResultRemoved
		}
		o.audit(ctx, js, l, &res)
		rep.add(res)
	}
	return rep, nil
}

// PurgeLetters deletes every dead letter in STEWARD_DLQ as it stands when
// the purge starts: it reads them (for the audit), then purges the stream
// below the sequence after the last one read, so a letter a worker writes
// meanwhile is kept.
func PurgeLetters(ctx context.Context, js jetstream.JetStream, o ActOptions) (*Report, error) {
	list, err := ListLetters(ctx, js, LetterFilter{}, Proofs{})
	if err != nil {
		return nil, err
	}
	rep := &Report{Action: ActionPurge, Results: []Result{}}
	if len(list.Letters) == 0 {
		return rep, nil
	}
	s, err := js.Stream(ctx, events.StreamDLQ)
	if err != nil {
		return nil, fmt.Errorf("look up stream %s on %s: %w", events.StreamDLQ, list.Server, err)
	}
	last := list.Letters[len(list.Letters)-1].Sequence
	if err := s.Purge(ctx, jetstream.WithPurgeSequence(last+1)); err != nil {
		return nil, fmt.Errorf("purge %s up to sequence %d: %w; nothing was removed, or part of it: list what is left with `steward dlq ls` and purge again", events.StreamDLQ, last, err)
	}
	for _, l := range list.Letters {
		res := resultOf(ActionPurge, l)
		res.Result = ResultPurged
		o.audit(ctx, js, l, &res)
		rep.add(res)
	}
	return rep, nil
}
