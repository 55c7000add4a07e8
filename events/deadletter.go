package events

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"

	"github.com/steward-dev/steward/internal/proof"
)

// Headers a dead letter carries besides the original event's. A letter
// keeps only the original's ce-* and content-type headers (KeptHeader), so
// every header named here was written by the worker, never by the
// publisher of the event.
const (
	// HeaderError is why the event could not be processed.
	HeaderError = "Steward-Error"
	// HeaderWorker is the consumer that dead-lettered it, <worker>-<instance>.
	HeaderWorker = "Steward-Worker"
	// HeaderStreamSeq is the event's sequence in STEWARD_EVENTS.
	HeaderStreamSeq = "Steward-Stream-Seq"
	// HeaderDelivered is how many deliveries it had.
	HeaderDelivered = "Steward-Deliveries"
	// HeaderSubject is the NATS subject the event was stored on. It is
	// what the worker read, for the operator; `steward dlq retry` never
	// publishes to it (it republishes to the subject the event maps to).
	HeaderSubject = "Steward-Subject"
	// HeaderStream is the stream the original is stored in; with
	// HeaderStreamSeq it is the reference an oversize letter is kept by.
	HeaderStream = "Steward-Stream"
	// HeaderDigest is the original's digest (LetterDigest): "sha256:" and
	// 64 hex digits.
	HeaderDigest = "Steward-Digest"
	// HeaderTruncated, when present, says the letter holds only part of
	// the original (it was too large to copy whole) and gives the
	// original data's size in bytes. The whole original is the event at
	// HeaderStream / HeaderStreamSeq, and HeaderDigest proves it.
	HeaderTruncated = "Steward-Truncated"
)

// DLQSubject is where a worker instance's dead letters go.
func DLQSubject(worker, instance string) string { return DLQPrefix + "." + worker + "." + instance }

// KeptHeader says whether a dead letter keeps a header of the original
// event: the CloudEvents attributes (ce-*) and the data's content type.
// JetStream's own headers (Nats-Msg-Id, Nats-Expected-*, Nats-Rollup, ...)
// would make the letter's write fail or collide, and Steward-* headers are
// the worker's to write, so a publisher can set neither.
func KeptHeader(name string) bool {
	n := strings.ToLower(name)
	return n == headerContentType || (strings.HasPrefix(n, headerPrefix) && len(n) > len(headerPrefix))
}

// keptHeaders returns the original's headers a letter keeps, with names
// lower-cased and the values of names that differ only in case merged in
// the order of their sorted names, so the result (and the digest over it)
// does not depend on map order.
func keptHeaders(h nats.Header) nats.Header {
	names := make([]string, 0, len(h))
	for k := range h {
		if KeptHeader(k) {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	out := make(nats.Header, len(names))
	for _, k := range names {
		lk := strings.ToLower(k)
		out[lk] = append(out[lk], h[k]...)
	}
	return out
}

// LetterDigest is the digest a dead letter names its original by: SHA-256
// over the original's NATS subject, the headers a letter keeps (names
// lower-cased, sorted) and its whole data, each part length-prefixed so no
// two originals share an encoding.
func LetterDigest(subject string, header nats.Header, data []byte) string {
	kept := keptHeaders(header)
	hash := sha256.New()
	part := func(b []byte) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		hash.Write(n[:])
		hash.Write(b)
	}
	part([]byte("steward-dead-letter-v1"))
	part([]byte(subject))
	names := make([]string, 0, len(kept))
	for k := range kept {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		for _, v := range kept[k] {
			part([]byte(k))
			part([]byte(v))
		}
	}
	part(data)
	return "sha256:" + hex.EncodeToString(hash.Sum(nil))
}

// LetterMsgID is the Nats-Msg-Id of the dead letter a worker writes for the
// event at seq with digest: a redelivery of the same event after a crash
// writes the same id and is stored once, and a letter published ahead of
// it under a guessed id must also have guessed the original's digest (and
// is then read back and compared, never trusted).
func LetterMsgID(consumer string, seq uint64, digest string) string {
	d := strings.TrimPrefix(digest, "sha256:")
	if len(d) > 32 {
		d = d[:32]
	}
	return "dlq-" + consumer + "-" + strconv.FormatUint(seq, 10) + "-" + d
}

// LetterSource is what a worker knows of an event it gives up on.
type LetterSource struct {
	// Consumer is the worker instance writing the letter, <worker>-<instance>,
	// and DLQSubject where it goes.
	Consumer   string
	DLQSubject string
	// Stream, Sequence and Subject locate the original.
	Stream   string
	Sequence uint64
	Subject  string
	// Delivered is how many deliveries it had.
	Delivered uint64
	// Reason is why it is dead, already free of secrets and on one line.
	Reason string
	// Header and Data are the original message's.
	Header nats.Header
	Data   []byte
	// MaxBytes is the largest message the server takes (its max payload);
	// zero means 1 MiB, NATS's default.
	MaxBytes int
	// Signer is the instance's document key: the letter carries its
	// detached proof (proof.Header, over DeadLetterProofContent), so a
	// letter someone else made the bus store on DLQSubject is told from
	// the instance's. Domain is the JetStream domain the proof binds. A
	// nil Signer writes an unsigned letter, which readers with keys show
	// as forged.
	Signer *proof.Signer
	Domain string
}

// letterMargin is room left under MaxBytes for the header block's framing
// and the worker's own headers beyond what is counted.
const letterMargin = 4 << 10

// truncatedDataBytes is how much of an oversize original's data a letter
// keeps, for an operator to recognise it; the rest is read by reference.
const truncatedDataBytes = 1 << 10

// truncatedHeaderBytes bounds each kept header's value when even the
// original's headers are too large to copy.
const truncatedHeaderBytes = 256

// NewDeadLetter builds the dead letter of src: the original's ce-* and
// content headers and its data, with the worker's Steward-* headers and a
// Nats-Msg-Id derived from the original's digest. An original too large to
// copy under MaxBytes is kept by reference: the letter names its stream,
// sequence and digest and holds only the start of its data (HeaderTruncated).
// It returns the message, signed by src.Signer, and the original's digest.
func NewDeadLetter(src LetterSource) (*nats.Msg, string) {
	msg, digest := newDeadLetter(src)
	if src.Signer != nil {
		SignMessage(msg, StreamDLQ, src.Domain, src.Signer, DeadLetterProofContent(msg.Header, msg.Data))
	}
	return msg, digest
}

func newDeadLetter(src LetterSource) (*nats.Msg, string) {
	digest := LetterDigest(src.Subject, src.Header, src.Data)
	msg := nats.NewMsg(src.DLQSubject)
	own := func(h nats.Header) {
		h.Set(HeaderError, src.Reason)
		h.Set(HeaderWorker, src.Consumer)
		h.Set(HeaderStream, src.Stream)
		h.Set(HeaderStreamSeq, strconv.FormatUint(src.Sequence, 10))
		h.Set(HeaderDelivered, strconv.FormatUint(src.Delivered, 10))
		h.Set(HeaderSubject, src.Subject)
		h.Set(HeaderDigest, digest)
		h.Set(nats.MsgIdHdr, LetterMsgID(src.Consumer, src.Sequence, digest))
	}
	own(msg.Header)
	overhead := headerBytes(msg.Header) + len(HeaderTruncated) + 24 + letterMargin
	if src.Signer != nil {
		// The proof is added last, over what the letter holds; its size
		// is fixed by the signer, so it is counted before choosing.
		overhead += proofSize(src.Signer)
	}
	limit := src.MaxBytes
	if limit <= 0 {
		limit = 1 << 20
	}
	budget := limit - overhead
	kept := keptHeaders(src.Header)
	hb := headerBytes(kept)
	if hb+len(src.Data) <= budget {
		for k, v := range kept {
			msg.Header[k] = v
		}
		msg.Data = src.Data
		return msg, digest
	}
	if hb > budget/2 {
		// Even the attributes are oversize: keep the ones an operator
		// reads, cut short; the reference holds the rest.
		small := nats.Header{}
		for _, k := range []string{"ce-specversion", "ce-type", "ce-id", "ce-source", "ce-subject", "ce-time", headerContentType} {
			if v := kept.Get(k); v != "" {
				small.Set(k, cut(v, truncatedHeaderBytes))
			}
		}
		kept = small
	}
	for k, v := range kept {
		msg.Header[k] = v
	}
	msg.Header.Set(HeaderTruncated, strconv.Itoa(len(src.Data)))
	msg.Data = src.Data[:min(len(src.Data), truncatedDataBytes, max(budget-headerBytes(kept), 0))]
	return msg, digest
}

// cut shortens s to at most n bytes without splitting a UTF-8 sequence.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && n < len(s) && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}

// headerBytes is what h weighs on the wire, near enough: "name: value\r\n"
// per value.
func headerBytes(h nats.Header) int {
	n := 0
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// DeadLetter is one message of STEWARD_DLQ read back: the original event
// (when it decodes) and what the worker said about it. It is the one
// parser of the dead-letter format; `steward dlq`, workertest and the
// end-to-end tests all read dead letters through it.
type DeadLetter struct {
	// DLQSequence is the letter's own sequence in STEWARD_DLQ, and
	// DLQSubject the subject it was stored on.
	DLQSequence uint64
	DLQSubject  string
	// Event is the original event, or nil when it could not be decoded
	// (which may be why it is here, or because the letter is truncated).
	Event *event.Event
	// Reason is the Steward-Error header.
	Reason string
	// Worker is the consumer that wrote it, <worker>-<instance>.
	Worker string
	// Subject is the original event's NATS subject, as the worker read it.
	Subject string
	// Stream and Sequence locate the original (Stream is empty in letters
	// written before it was recorded; the original is then in
	// STEWARD_EVENTS).
	Stream   string
	Sequence uint64
	// Delivered is how many deliveries it had.
	Delivered int
	// Digest is the original's LetterDigest, "" in letters written before
	// digests were recorded.
	Digest string
	// Truncated says the letter holds only the start of the original's
	// data (OriginalSize bytes in all); the original is read by reference.
	Truncated    bool
	OriginalSize int
	Headers      nats.Header
	Data         []byte
}

// ParseDeadLetter reads a message of STEWARD_DLQ. It never fails: a field
// whose header is missing or unreadable is left zero, so an operator still
// sees what there is.
func ParseDeadLetter(dlqSeq uint64, subject string, h nats.Header, data []byte) DeadLetter {
	if h == nil {
		h = nats.Header{}
	}
	d := DeadLetter{
		DLQSequence: dlqSeq, DLQSubject: subject, Headers: h, Data: data,
		Reason: h.Get(HeaderError), Worker: h.Get(HeaderWorker), Subject: h.Get(HeaderSubject),
		Stream: h.Get(HeaderStream), Digest: h.Get(HeaderDigest),
	}
	d.Sequence, _ = strconv.ParseUint(h.Get(HeaderStreamSeq), 10, 64)
	d.Delivered, _ = strconv.Atoi(h.Get(HeaderDelivered))
	if v := h.Get(HeaderTruncated); v != "" {
		d.Truncated = true
		d.OriginalSize, _ = strconv.Atoi(v)
	}
	if d.Truncated {
		// A prefix of the data is not the event: it is read by reference.
		return d
	}
	if e, err := Decode(keptHeaders(h), data); err == nil {
		d.Event = &e
	}
	return d
}

// EventID is the original event's id, read from its headers even when the
// event does not decode.
func (d DeadLetter) EventID() string {
	if d.Event != nil {
		return d.Event.ID()
	}
	for k, v := range d.Headers {
		if strings.EqualFold(k, "ce-id") && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

// ErrLetterUnverifiable says a dead letter cannot prove its content: it
// names no digest (an older letter), or it holds only part of the original.
var ErrLetterUnverifiable = errors.New("the dead letter cannot be verified on its own")

// Verify checks that the letter holds the original it names: its subject,
// kept headers and data hash to its digest. A truncated letter, or one
// without a digest, wraps ErrLetterUnverifiable: check its original with
// VerifyOriginal instead.
func (d DeadLetter) Verify() error {
	switch {
	case d.Digest == "":
		return fmt.Errorf("%w: it has no %s header (written by an older Steward)", ErrLetterUnverifiable, HeaderDigest)
	case d.Truncated:
		return fmt.Errorf("%w: it holds %d of the original's %d bytes; the original is %s sequence %d", ErrLetterUnverifiable, len(d.Data), d.OriginalSize, d.streamName(), d.Sequence)
	}
	if got := LetterDigest(d.Subject, d.Headers, d.Data); got != d.Digest {
		return fmt.Errorf("the dead letter's content does not match its %s: it was altered or forged", HeaderDigest)
	}
	return nil
}

// VerifyOriginal checks that a message read by the letter's reference is
// the original it names.
func (d DeadLetter) VerifyOriginal(subject string, header nats.Header, data []byte) error {
	if d.Digest == "" {
		return fmt.Errorf("%w: it has no %s header", ErrLetterUnverifiable, HeaderDigest)
	}
	if got := LetterDigest(subject, header, data); got != d.Digest {
		return fmt.Errorf("the message at %s sequence %d is not the one the dead letter names (digest differs): the original is gone or was replaced", d.streamName(), d.Sequence)
	}
	return nil
}

func (d DeadLetter) streamName() string {
	if d.Stream == "" {
		return StreamEvents
	}
	return d.Stream
}

// CheckWorker refuses a letter whose Steward-Worker header and DLQ subject
// disagree: a worker <name>-<instance> writes only to
// steward.dlq.<name>.<instance>, so a letter that says otherwise was not
// written by the worker it names.
func (d DeadLetter) CheckWorker() error {
	rest, ok := strings.CutPrefix(d.DLQSubject, DLQPrefix+".")
	name, instance, two := strings.Cut(rest, ".")
	if !ok || !two || CheckKey(name) != nil || CheckKey(instance) != nil {
		return fmt.Errorf("dead letter %d is on %q, which is not a worker's DLQ subject %s.<worker>.<instance>", d.DLQSequence, d.DLQSubject, DLQPrefix)
	}
	if d.Worker != name+"-"+instance {
		return fmt.Errorf("dead letter %d says it was written by %q but is on %s, which only %s-%s writes to", d.DLQSequence, d.Worker, d.DLQSubject, name, instance)
	}
	return nil
}

// SameLetter reports whether two letters describe the same dead event the
// same way: the same subject, worker, original (stream, sequence, subject,
// digest), kept headers and data. The reason and the delivery count may
// differ between two writes of one event and are not compared.
func SameLetter(a, b DeadLetter) bool {
	if a.DLQSubject != b.DLQSubject || a.Worker != b.Worker || a.Stream != b.Stream || a.Sequence != b.Sequence ||
		a.Subject != b.Subject || a.Digest != b.Digest || a.Truncated != b.Truncated || a.OriginalSize != b.OriginalSize ||
		!bytes.Equal(a.Data, b.Data) {
		return false
	}
	ka, kb := keptHeaders(a.Headers), keptHeaders(b.Headers)
	if len(ka) != len(kb) {
		return false
	}
	for k, v := range ka {
		if !slices.Equal(v, kb[k]) {
			return false
		}
	}
	return true
}
