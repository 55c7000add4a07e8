package events

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/internal/proof"
)

// ErrConflict says a compare-and-swap write lost: another process wrote the
// same entry first. Read again and decide again.
var ErrConflict = errors.New("written meanwhile by another process")

// StoreOptions configure a Store.
type StoreOptions struct {
	// Signer signs what this store writes; nil makes a store that only
	// reads.
	Signer *proof.Signer
	// Verifier says whose documents are believed. A store without one
	// (a tool on an open development bus) returns every document as
	// Unverified, to show and never to decide on.
	Verifier *proof.Verifier
	// Domain is the JetStream domain the bucket is in, bound into every
	// signature so a document copied from another site does not verify.
	Domain string
	// OnForged is told of every document that does not verify.
	OnForged func(Forgery)
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Store is the checkpoint bucket as every reader and writer sees it: each
// document is written with its writer's proof and read back with its
// revision and whether it verified for the writer its key belongs to
// (InfoOf). A document that does not verify is reported (OnForged) and
// returned untrusted, with its revision, so a compare-and-swap can still
// replace it.
type Store struct {
	kv jetstream.KeyValue
	// js finds the bucket's stream, for what a forged message's headers
	// say; rawStream is it once found.
	js        jetstream.JetStream
	rawMu     sync.Mutex
	rawStream jetstream.Stream
	o         StoreOptions
	// legacyBelow is the upgrade record's sequence: unsigned documents at
	// or below it are the previous version's.
	legacyBelow uint64
	// upgradedAt is when the upgrade record was made: unsigned outcomes
	// and dead letters stored before it are the previous version's.
	upgradedAt time.Time
	// upgradeRead says the upgrade record has been read; a store that has
	// not read it reads it at the first unsigned document it meets, so an
	// instance whose documents are all signed never asks for it.
	upgradeRead bool

	mu sync.Mutex
	// hwm is, per key, the highest counter this process has read or
	// written: a genuine older document put back under the key is lower.
	hwm map[string]uint64
}

// NewStore reads and writes the bucket kv. js finds the bucket's stream
// for diagnostics and may be nil. Call LoadUpgrade to read the upgrade
// record; until then no unsigned document is believed.
func NewStore(kv jetstream.KeyValue, o StoreOptions) *Store {
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Store{kv: kv, o: o, hwm: map[string]uint64{}}
}

// OpenStore binds the checkpoint bucket on js and reads its upgrade
// record.
func OpenStore(ctx context.Context, js jetstream.JetStream, o StoreOptions) (*Store, error) {
	kv, err := js.KeyValue(ctx, CheckpointBucket)
	if err != nil {
		return nil, fmt.Errorf("the checkpoint bucket %s: %w (steward setup, run with operator credentials, creates it)", CheckpointBucket, err)
	}
	s := NewStore(kv, o)
	s.BindStream(ctx, js)
	if err := s.LoadUpgrade(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// BindStream lets the store find the bucket's stream on js, so a forged
// document's stored headers can say where it was reflected from; without
// it, they are not read. The stream is looked up on the first forgery, not
// here: a stream info is the meta leader's work, and ten thousand
// instances starting at once must not send it ten thousand.
func (s *Store) BindStream(_ context.Context, js jetstream.JetStream) { s.js = js }

// raw is the bucket's stream, looked up once on first use (nil when it
// cannot be).
func (s *Store) raw(ctx context.Context) jetstream.Stream {
	s.rawMu.Lock()
	defer s.rawMu.Unlock()
	if s.rawStream == nil && s.js != nil {
		if st, err := s.js.Stream(ctx, "KV_"+CheckpointBucket); err == nil {
			s.rawStream = st
		}
	}
	return s.rawStream
}

// KV is the bucket, for watches and listings whose entries Open verifies.
func (s *Store) KV() jetstream.KeyValue { return s.kv }

// Signer is what this store signs with (nil for a reader).
func (s *Store) Signer() *proof.Signer { return s.o.Signer }

// Verifier is whose documents this store believes (nil: none verified),
// and Domain the JetStream domain it binds: a reader of the outcome and
// DLQ streams verifies their messages with the same (docs/design.md §7).
func (s *Store) Verifier() *proof.Verifier { return s.o.Verifier }

// Domain is the JetStream domain this store's signatures bind.
func (s *Store) Domain() string { return s.o.Domain }

// LoadUpgrade reads the upgrade record. A missing or untrusted one leaves
// every unsigned document untrusted: the safe side, where a key's events
// are only decided again.
func (s *Store) LoadUpgrade(ctx context.Context) error {
	d, err := s.Get(ctx, UpgradeKey)
	if err != nil {
		return err
	}
	var u Upgrade
	if d.Trusted {
		if err := d.Decode(&u); err != nil {
			return err
		}
	}
	s.mu.Lock()
	s.legacyBelow, s.upgradedAt, s.upgradeRead = u.Sequence, u.At, true
	s.mu.Unlock()
	return nil
}

// UpgradedAt is when the trusted upgrade record was made (zero: none):
// an unsigned outcome or dead letter stored before it was written by the
// version before proofs, one stored after it was not written by Steward.
func (s *Store) UpgradedAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.upgradedAt
}

// Doc is one document as read.
type Doc struct {
	Key  string
	Info KeyInfo
	// Revision is the entry's revision (0: no document), the base of a
	// compare-and-swap even when the document is not trusted.
	Revision uint64
	// Value is the signed content; nil unless Trusted.
	Value []byte
	// N is the document's counter on its key.
	N uint64
	// Trusted says the document verified for its key's writer, or is a
	// legacy document below the upgrade record.
	Trusted bool
	// Legacy says it is the previous version's unsigned document.
	Legacy bool
	// Unverified says the reader had no keys to verify with: Value is
	// what is stored, to show, never to decide on.
	Unverified bool
	// Forgery says why it was not believed, when it is present and not
	// trusted.
	Forgery *Forgery
}

// Present says there is a document under the key, believed or not.
func (d Doc) Present() bool { return d.Revision != 0 }

// Decode decodes the trusted (or, for a reader without keys, unverified)
// content into v; an untrusted or missing document leaves v alone.
func (d Doc) Decode(v any) error {
	if !d.Trusted && !d.Unverified || d.Value == nil {
		return nil
	}
	if err := json.Unmarshal(d.Value, v); err != nil {
		return fmt.Errorf("the %s %s is not readable: %w", d.Info.Kind, d.Key, err)
	}
	return nil
}

// Get reads the document under key. A missing one is a Doc with revision
// 0 and no error.
func (s *Store) Get(ctx context.Context, key string) (Doc, error) {
	entry, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return Doc{Key: key, Info: InfoOf(key)}, nil
	}
	if err != nil {
		return Doc{Key: key, Info: InfoOf(key)}, fmt.Errorf("read %s from %s: %w", key, CheckpointBucket, err)
	}
	d := s.open(ctx, key, entry.Value(), entry.Revision())
	if d.Legacy && s.o.Signer != nil && s.o.Signer.By() == d.Info.Writer {
		// Read once, then signed: the previous version's document
		// becomes this one's, so it stops depending on the record.
		if rev, err := s.put(ctx, key, d.Value, d.Revision, true); err == nil {
			d.Revision, d.Legacy = rev, false
		}
	}
	return d, nil
}

// Open verifies an entry read by a watch or a listing.
func (s *Store) Open(ctx context.Context, entry jetstream.KeyValueEntry) Doc {
	return s.open(ctx, entry.Key(), entry.Value(), entry.Revision())
}

func (s *Store) open(ctx context.Context, key string, raw []byte, rev uint64) Doc {
	d := Doc{Key: key, Info: InfoOf(key), Revision: rev}
	if d.Info.Kind == KindUnknown {
		return s.forged(ctx, d, "the key is not one of the bucket's layout")
	}
	s.mu.Lock()
	legacyBelow, hwm := s.legacyBelow, s.hwm[key]
	s.mu.Unlock()
	if s.o.Verifier == nil {
		// A tool with no keys to verify with (an open development bus)
		// shows what is stored, marked as not verified; nothing decides
		// on it.
		content, _, _ := proof.Split(raw)
		d.Value, d.Unverified = bytes.Clone(content), true
		return d
	}
	opened, err := s.o.Verifier.Open(s.scope(key), raw, d.Info.Writer)
	if errors.Is(err, proof.ErrUnsigned) && key != UpgradeKey {
		s.mu.Lock()
		read := s.upgradeRead
		s.mu.Unlock()
		if !read {
			// Left unread on an error: the document is then not believed
			// (the safe side), and the next unsigned one tries again.
			_ = s.LoadUpgrade(ctx)
			s.mu.Lock()
			legacyBelow = s.legacyBelow
			s.mu.Unlock()
		}
	}
	switch {
	case errors.Is(err, proof.ErrUnsigned) && rev <= legacyBelow:
		d.Value, d.Trusted, d.Legacy = bytes.Clone(opened.Content), true, true
		return d
	case errors.Is(err, proof.ErrUnsigned):
		return s.forged(ctx, d, fmt.Sprintf("it carries no proof of its writer, and was written after the upgrade record (revision %d, record %d): only %s writes here", rev, legacyBelow, d.Info.Writer))
	case err != nil:
		return s.forged(ctx, d, err.Error())
	case opened.N < hwm:
		return s.forged(ctx, d, fmt.Sprintf("it is an older document of %s put back (counter %d, this process has seen %d)", d.Info.Writer, opened.N, hwm))
	}
	s.mu.Lock()
	s.hwm[key] = max(s.hwm[key], opened.N)
	s.mu.Unlock()
	d.Value, d.N, d.Trusted = opened.Content, opened.N, true
	return d
}

// forged reports d as a forgery and returns it untrusted.
func (s *Store) forged(ctx context.Context, d Doc, reason string) Doc {
	f := Forgery{Key: d.Key, Kind: d.Info.Kind, Revision: d.Revision, Reason: reason, SeenAt: s.o.Now().UTC()}
	if rev, from := s.inspect(ctx, d.Key); rev != 0 {
		// A reflected direct get carries the Nats-Sequence of the message
		// it answered with ahead of its own, and nats.go reads the first
		// as the revision: the stored one is the last, and only it makes
		// the compare-and-swap that replaces the forgery succeed.
		d.Revision, f.Revision, f.ReflectedFrom = rev, rev, from
	}
	d.Forgery = &f
	if s.o.OnForged != nil {
		s.o.OnForged(f)
	}
	return d
}

// inspect reads the stored message under key with its headers and says
// what it is: its revision (the last Nats-Sequence) and where it came from.
// A direct get's answer keeps the Nats-Stream, Nats-Subject and
// Nats-Sequence of the message it answered with, and a publish
// acknowledgement names its stream. Reflection is how an identity writes
// under a key it may not publish to, so this names the key, and with it
// the identity, that made the request. Zero when it cannot be read.
func (s *Store) inspect(ctx context.Context, key string) (uint64, string) {
	stream := s.raw(ctx)
	if stream == nil {
		return 0, ""
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	// By subject, not by sequence: an instance may read only its own keys,
	// and a read by sequence could be anyone's.
	prefix := "$KV." + CheckpointBucket + "."
	m, err := stream.GetLastMsgForSubject(ctx, prefix+key)
	if err != nil {
		return 0, ""
	}
	rev := m.Sequence
	if seqs := m.Header.Values("Nats-Sequence"); len(seqs) > 1 {
		if n, err := strconv.ParseUint(seqs[len(seqs)-1], 10, 64); err == nil {
			rev = n
		}
	}
	return rev, strings.ReplaceAll(ReflectedFrom(prefix+key, m.Header, m.Data), prefix, "")
}

func (s *Store) scope(key string) proof.Scope {
	return proof.Scope{Bucket: CheckpointBucket, Domain: s.o.Domain, Key: key}
}

// Put writes v under key if its revision is still rev (0: only if absent)
// and returns the new revision. A lost race wraps ErrConflict.
func (s *Store) Put(ctx context.Context, key string, v any, rev uint64) (uint64, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return 0, fmt.Errorf("write %s: %w", key, err)
	}
	return s.put(ctx, key, raw, rev, true)
}

// Set writes v under key whatever is there: for documents only one process
// writes (a stream reader's cursor, a status, a pause).
func (s *Store) Set(ctx context.Context, key string, v any) (uint64, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return 0, fmt.Errorf("write %s: %w", key, err)
	}
	return s.put(ctx, key, raw, 0, false)
}

// Delete removes the document under key.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := s.kv.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("delete %s from %s: %w", key, CheckpointBucket, err)
	}
	return nil
}

func (s *Store) put(ctx context.Context, key string, content []byte, rev uint64, cas bool) (uint64, error) {
	if s.o.Signer == nil {
		return 0, fmt.Errorf("write %s: no document key to sign it with, so nothing was written; give the identity its key (--document-key, or the .dockey that steward creds issue writes beside the credentials)", key)
	}
	s.mu.Lock()
	n := s.hwm[key] + 1
	s.mu.Unlock()
	sealed, err := s.o.Signer.Seal(s.scope(key), n, content)
	if err != nil {
		return 0, err
	}
	var next uint64
	switch {
	case !cas:
		next, err = s.kv.Put(ctx, key, sealed)
	case rev == 0:
		next, err = s.kv.Create(ctx, key, sealed)
	default:
		next, err = s.kv.Update(ctx, key, sealed, rev)
	}
	// A lost race is 10071 on a single server and 10164 on a replicated
	// bucket; nats.go maps both to these two errors.
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return 0, fmt.Errorf("%s: %w", key, ErrConflict)
	}
	if err != nil {
		return 0, fmt.Errorf("write %s to %s: %w", key, CheckpointBucket, err)
	}
	s.mu.Lock()
	s.hwm[key] = max(s.hwm[key], n)
	s.mu.Unlock()
	return next, nil
}

// RecordUpgrade writes the upgrade record, signed by this store's signer
// (the operator), unless a trusted one exists: the bucket's last sequence
// now, so every unsigned document already stored counts as the previous
// version's, to be read once and signed again, and any written later as
// forged. It returns the record in force.
func (s *Store) RecordUpgrade(ctx context.Context) (Upgrade, error) {
	d, err := s.Get(ctx, UpgradeKey)
	if err != nil {
		return Upgrade{}, err
	}
	var u Upgrade
	if d.Trusted {
		err := d.Decode(&u)
		return u, err
	}
	if s.o.Signer == nil || s.o.Signer.By() != OperatorWriter {
		return Upgrade{}, fmt.Errorf("the upgrade record of %s is missing and only the operator's document key may write it (it sits beside the operator's credentials as operator.dockey)", CheckpointBucket)
	}
	stream := s.raw(ctx)
	if stream == nil {
		return Upgrade{}, fmt.Errorf("the upgrade record of %s: the bucket's stream was not found", CheckpointBucket)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return Upgrade{}, fmt.Errorf("the upgrade record of %s: %w", CheckpointBucket, err)
	}
	u = Upgrade{Sequence: info.State.LastSeq, At: s.o.Now().UTC()}
	if _, err := s.Put(ctx, UpgradeKey, u, d.Revision); err != nil {
		return Upgrade{}, fmt.Errorf("the upgrade record of %s: %w", CheckpointBucket, err)
	}
	s.mu.Lock()
	s.legacyBelow, s.upgradedAt = u.Sequence, u.At
	s.mu.Unlock()
	return u, nil
}
