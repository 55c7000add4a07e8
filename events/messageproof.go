package events

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/nats-io/nats.go"

	"github.com/steward-dev/steward/internal/proof"
)

// Outcomes and dead letters prove their writer as stored documents do
// (docs/design.md §7). NATS checks a request's subject, never its reply
// subject, and JetStream answers inside the account: so any identity that
// may make a request can have the server store a message it shaped on
// another instance's outcome or DLQ subject. The permission to publish
// there says nothing; only the instance's signature does.
//
// A message's proof is detached: a proof.Proof, as JSON, in the
// proof.Header header, over MessageScope (the stream, the domain and the
// NATS subject) and a canonical content that this file is the one home
// of, so the runtime that signs and the tools that verify cannot drift
// apart. The proof's counter is 0: a stream subject holds many messages,
// so there is no per-key high-water mark to keep, and the content already
// names the event that caused the message (its causation, or the
// original's stream and sequence).

// MessageScope is what a detached proof of a message stored in stream on
// subject binds besides its content.
func MessageScope(stream, domain, subject string) proof.Scope {
	return proof.Scope{Bucket: stream, Domain: domain, Key: subject}
}

// contentWriter builds a canonical content: every part length-prefixed, so
// no two different messages share an encoding whatever their values hold.
type contentWriter struct{ b []byte }

// newContentWriter starts a content with room for its attributes and
// data, so a worker signing an outcome for every event does not copy it
// as it grows.
func newContentWriter(data []byte) *contentWriter {
	return &contentWriter{b: make([]byte, 0, 512+len(data))}
}

func (w *contentWriter) part(s string) {
	w.b = binary.BigEndian.AppendUint64(w.b, uint64(len(s)))
	w.b = append(w.b, s...)
}

// data is part for the data, without copying it to a string first.
func (w *contentWriter) data(b []byte) {
	w.b = binary.BigEndian.AppendUint64(w.b, uint64(len(b)))
	w.b = append(w.b, b...)
}

// OutcomeProofContent is what an outcome's proof signs: its id, type,
// source, subject attribute, time, data content type and data schema,
// every extension (causationid, traceparent, replay, replayid, ...) by
// name in order, and its data. Values are in the CloudEvents canonical
// string form (types.Format, as the codec writes them), so the event the
// runtime signs and the one a reader decodes give the same bytes.
func OutcomeProofContent(e event.Event) []byte {
	w := newContentWriter(e.Data())
	w.part("steward.outcome.v1")
	attr := func(name, value string) {
		w.part(name)
		w.part(value)
	}
	attr("id", e.ID())
	attr("type", e.Type())
	attr("source", e.Source())
	attr("subject", e.Subject())
	if t := e.Time(); !t.IsZero() {
		s, _ := types.Format(t)
		attr("time", s)
	}
	attr("datacontenttype", e.DataContentType())
	attr("dataschema", e.DataSchema())
	ext := e.Extensions()
	names := make([]string, 0, len(ext))
	for k := range ext {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		s, err := types.Format(ext[k])
		if err != nil {
			// Not a CloudEvents value: it could not have been encoded, so
			// it is bound by its Go form and never matches a decoded one.
			s = fmt.Sprintf("%T:%v", ext[k], ext[k])
		}
		attr("ext:"+strings.ToLower(k), s)
	}
	w.part("data")
	w.data(e.Data())
	return w.b
}

// DeadLetterProofContent is what a dead letter's proof signs: every header
// the letter carries but JetStream's own (Nats-*) and the proof itself,
// so the worker's Steward-* headers (error, worker, stream, sequence,
// deliveries, subject, digest, truncation) and the original's ce-* and
// content-type, names lower-cased and sorted, values in order; then the
// data. A truncated letter's data is its prefix, and its digest header
// binds the whole original.
func DeadLetterProofContent(h nats.Header, data []byte) []byte {
	names := make([]string, 0, len(h))
	for k := range h {
		lk := strings.ToLower(k)
		if strings.HasPrefix(lk, "nats-") || lk == strings.ToLower(proof.Header) {
			continue
		}
		names = append(names, k)
	}
	// Sorted by the names as stored, then merged by lower-cased name, as
	// keptHeaders does, so map order never changes the bytes.
	slices.Sort(names)
	merged := map[string][]string{}
	var lower []string
	for _, k := range names {
		lk := strings.ToLower(k)
		if _, ok := merged[lk]; !ok {
			lower = append(lower, lk)
		}
		merged[lk] = append(merged[lk], h[k]...)
	}
	slices.Sort(lower)
	w := newContentWriter(data)
	w.part("steward.dead-letter.v1")
	for _, k := range lower {
		for _, v := range merged[k] {
			w.part(k)
			w.part(v)
		}
	}
	w.part("data")
	w.data(data)
	return w.b
}

// messageCounter is the counter of every message's proof (why it is 0 is
// said at the top of this file). SignMessage signs with it and proofSize
// counts with it, so the room left for a proof is the proof made.
const messageCounter = 0

// SignMessage puts s's detached proof of content, for msg's subject in
// stream, into msg's proof.Header.
func SignMessage(msg *nats.Msg, stream, domain string, s *proof.Signer, content []byte) {
	raw := s.AppendProof(nil, MessageScope(stream, domain, msg.Subject), messageCounter, content)
	if msg.Header == nil {
		msg.Header = nats.Header{}
	}
	msg.Header.Set(proof.Header, string(raw))
}

// proofSize is how many bytes s's proof header (SignMessage's) adds to a
// message: the header's name, the proof, and the ": " and CRLF around the
// value.
func proofSize(s *proof.Signer) int {
	return len(proof.Header) + s.ProofLen(messageCounter) + 4
}

// SubjectWriter is the one identity that writes subject, an instance's
// outcome (steward.outcomes.<worker>.<instance>) or DLQ
// (steward.dlq.<worker>.<instance>) subject: "<worker>-<instance>".
func SubjectWriter(subject string) (string, error) {
	for _, prefix := range []string{OutcomesPrefix, DLQPrefix} {
		rest, ok := strings.CutPrefix(subject, prefix+".")
		if !ok {
			continue
		}
		worker, instance, two := strings.Cut(rest, ".")
		if !two || CheckKey(worker) != nil || CheckKey(instance) != nil {
			break
		}
		return worker + "-" + instance, nil
	}
	return "", fmt.Errorf("%s is not an instance's outcome or DLQ subject (%s.<worker>.<instance>, %s.<worker>.<instance>), so no instance vouches for what it holds", subject, OutcomesPrefix, DLQPrefix)
}

// VerifyMessage checks the proof in h of content, for subject in stream,
// as written by one of writers. A message with no proof wraps
// proof.ErrUnsigned, any other failure proof.ErrForged; both say where
// the message came from when its headers show it was reflected.
func VerifyMessage(v *proof.Verifier, stream, domain, subject string, h nats.Header, data, content []byte, writers ...string) error {
	raw := headerValue(h, proof.Header)
	var err error
	if raw == "" {
		err = fmt.Errorf("%w (only %s writes %s)", proof.ErrUnsigned, strings.Join(writers, " or "), subject)
	} else {
		var p proof.Proof
		if jerr := json.Unmarshal([]byte(raw), &p); jerr != nil {
			err = fmt.Errorf("%w: its %s header is not a proof", proof.ErrForged, proof.Header)
		} else {
			err = v.Verify(MessageScope(stream, domain, subject), p, content, writers...)
		}
	}
	if err == nil {
		return nil
	}
	if from := ReflectedFrom(subject, h, data); from != "" {
		return fmt.Errorf("%w; it was reflected onto %s by %s", err, subject, from)
	}
	return err
}

// ReflectedFrom reads what a stored message says of where it came from
// when it is a server's answer rather than a publish: a direct get's answer
// keeps the Nats-Stream and Nats-Subject of the message it answered with,
// and a publish acknowledgement names its stream in its data. Reflection is
// how an identity writes where it may not publish, so this names the
// subject (and with it the identity) that made the request. self is the
// subject the message is stored on; "" when nothing says.
func ReflectedFrom(self string, h nats.Header, data []byte) string {
	var from []string
	for k, vs := range h {
		if strings.EqualFold(k, "Nats-Subject") {
			for _, v := range vs {
				if v != self {
					from = append(from, v)
				}
			}
		}
	}
	if len(from) > 0 {
		slices.Sort(from)
		return fmt.Sprintf("a direct get of %s (stream %s)", strings.Join(from, ", "), headerValue(h, "Nats-Stream"))
	}
	var ack struct {
		Stream string `json:"stream"`
		Seq    uint64 `json:"seq"`
	}
	if json.Unmarshal(data, &ack) == nil && ack.Stream != "" {
		return fmt.Sprintf("a publish acknowledgement of stream %s (sequence %d)", ack.Stream, ack.Seq)
	}
	return ""
}

// headerValue reads a header without regard to the case of its name, as
// the codec does.
func headerValue(h nats.Header, name string) string {
	if v := h.Get(name); v != "" {
		return v
	}
	for k, v := range h {
		if strings.EqualFold(k, name) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

// VerifyOutcome checks the proof in h of the outcome e, stored on subject
// in STEWARD_OUTCOMES (data is the stored payload), as written by the
// instance subject names. An outcome a replay emitted (the replay
// extension, events.ReplayExtension) may be the operator's too: a replay
// publishes on the instance's subject as whoever runs it, and the
// operator may write anywhere.
func VerifyOutcome(v *proof.Verifier, domain, subject string, h nats.Header, data []byte, e event.Event) error {
	writer, err := SubjectWriter(subject)
	if err != nil {
		return fmt.Errorf("%w: %w", proof.ErrForged, err)
	}
	writers := []string{writer}
	if s, _ := types.Format(e.Extensions()["replay"]); s == "true" {
		writers = append(writers, OperatorWriter)
	}
	return VerifyMessage(v, StreamOutcomes, domain, subject, h, data, OutcomeProofContent(e), writers...)
}

// VerifyProof checks the letter's proof as written by the instance its
// DLQ subject names: a letter is believed to say what that instance did
// only then.
func (d DeadLetter) VerifyProof(v *proof.Verifier, domain string) error {
	writer, err := SubjectWriter(d.DLQSubject)
	if err != nil {
		return fmt.Errorf("%w: %w", proof.ErrForged, err)
	}
	return VerifyMessage(v, StreamDLQ, domain, d.DLQSubject, d.Headers, d.Data, DeadLetterProofContent(d.Headers, d.Data), writer)
}
