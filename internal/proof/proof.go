// Package proof is how a stored document proves who wrote it.
//
// NATS permissions check the subject a client publishes to, never the reply
// subject of its request, and JetStream answers a direct get or a publish
// from inside the account: so any identity that may make a request can
// have the server store a message it shaped under another instance's key
// of the checkpoint bucket, or on another instance's outcome subject
// (docs/design.md §7). Permissions keep identities out of each other's
// reads; only a signature on what is stored keeps them out of each other's
// writes.
//
// Every document Steward stores carries a Proof: an ed25519 signature by
// the writer's document key over the bucket, the JetStream domain, the key,
// a per-key counter, the writer's name and the content. A document copied
// to another key, bucket or domain, or written by another identity, does
// not verify. The document key is not the NATS seed: nats.go signs
// whatever nonce a server sends with the seed, so any server an instance
// connects to could get the seed's signature over bytes it chose.
//
// A reader believes a key when it is pinned (the reader's own, or one in
// its configuration) or certified: the proof carries the writer's user JWT,
// signed by an account key the reader trusts, whose tags name the key and
// the writer. Nothing is trusted on first use.
package proof

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// Scope is where a document is stored: what its signature binds besides
// the content, so a document moved anywhere else does not verify.
type Scope struct {
	// Bucket is the KV bucket, or the stream for a detached proof.
	Bucket string
	// Domain is the JetStream domain ("" for none).
	Domain string
	// Key is the KV key, or the NATS subject for a detached proof.
	Key string
}

// Proof is the signature a stored document carries, as the last member of
// its JSON object ("proof") or, for a message, in the Header header.
type Proof struct {
	// V is the proof format, 1.
	V int `json:"v"`
	// By names the writer: "operator", or a worker instance as
	// "<worker>-<instance>" (natsauth.Identity.Name).
	By string `json:"by"`
	// Key is the writer's document key, ed25519, hex.
	Key string `json:"key"`
	// N is the document's counter on its key: one more than the last
	// document the writer wrote there, so a genuine older document put
	// back is told from the newest (a reader keeps its high-water mark).
	N uint64 `json:"n"`
	// Cert is the writer's NATS user JWT, which certifies Key for By
	// (empty when the reader is expected to have the key pinned).
	Cert string `json:"cert,omitempty"`
	// Sig is the ed25519 signature, base64.
	Sig string `json:"sig"`
}

// Header is the NATS header a message's detached proof travels in
// (outcomes, dead letters, audit events).
const Header = "Steward-Proof"

// member is how the proof is appended to a document's JSON object.
var member = []byte(`"proof":`)

// Errors of Open. Each is wrapped with what was found.
var (
	// ErrUnsigned: the document carries no proof at all (written by a
	// version before signatures, or by anyone who can reflect a message
	// onto the key).
	ErrUnsigned = errors.New("carries no proof of its writer")
	// ErrForged: the document carries a proof that does not verify for
	// this scope, or not by a writer the reader expects.
	ErrForged = errors.New("does not verify")
)

// message is what a signature covers. Every part but the content is
// length-free text with no NUL, so NUL separates them unambiguously.
func message(s Scope, by string, n uint64, content []byte) []byte {
	// Sized once: the content is copied whole (ed25519 signs one buffer),
	// and a buffer grown as it is written copied it again at every step.
	// The 5 are the NULs after the bucket, domain, key, counter and writer.
	b := make([]byte, 0, len(messagePrefix)+len(s.Bucket)+len(s.Domain)+len(s.Key)+len(by)+maxCounterDigits+5+len(content))
	b = append(b, messagePrefix...)
	b = append(append(b, s.Bucket...), 0)
	b = append(append(b, s.Domain...), 0)
	b = append(append(b, s.Key...), 0)
	b = append(strconv.AppendUint(b, n, 10), 0)
	b = append(append(b, by...), 0)
	return append(b, content...)
}

// messagePrefix starts every message a proof signs: the format.
const messagePrefix = "steward.proof.v1\x00"

// maxCounterDigits is the most digits a counter (a uint64) has.
const maxCounterDigits = 20

// sigLen is an ed25519 signature's length in standard base64: every one is
// 64 bytes, so every proof of one signer and counter has the same length.
var sigLen = base64.StdEncoding.EncodedLen(ed25519.SignatureSize)

// Seal returns content, a JSON object, with the signer's proof appended as
// its last member. content must not have a "proof" member of its own.
func (s *Signer) Seal(scope Scope, n uint64, content []byte) ([]byte, error) {
	content = bytes.TrimSpace(content)
	if len(content) < 2 || content[0] != '{' || content[len(content)-1] != '}' {
		return nil, fmt.Errorf("seal %s: the content is not a JSON object", scope.Key)
	}
	out := make([]byte, 0, len(content)+1+len(member)+s.ProofLen(n)+1)
	out = append(out, content[:len(content)-1]...)
	if len(bytes.TrimSpace(content[1:len(content)-1])) != 0 {
		out = append(out, ',')
	}
	out = append(out, member...)
	out = append(s.AppendProof(out, scope, n, content), '}')
	// Clipped: the room left over is not the caller's to append into (a
	// copy appended to would write into this one).
	return out[:len(out):len(out)], nil
}

// AppendProof appends to dst the signer's proof of content for scope, as
// the JSON json.Marshal makes of its Proof: how a proof is stored, as a
// document's last member (Seal) or in a message's Header.
func (s *Signer) AppendProof(dst []byte, scope Scope, n uint64, content []byte) []byte {
	dst = append(dst, s.head...)
	dst = strconv.AppendUint(dst, n, 10)
	dst = append(dst, s.tail...)
	dst = base64.StdEncoding.AppendEncode(dst, ed25519.Sign(s.priv, message(scope, s.by, n, content)))
	return append(dst, `"}`...)
}

// ProofLen is the length of the proof AppendProof makes with counter n,
// whatever it signs: so a caller can leave room for a proof (a dead
// letter cut to its stream's limit) without making one to measure it.
func (s *Signer) ProofLen(n uint64) int {
	var digits [maxCounterDigits]byte
	return len(s.head) + len(strconv.AppendUint(digits[:0], n, 10)) + len(s.tail) + sigLen + len(`"}`)
}

// Split separates a stored document into the content its proof signs and
// the proof. A document with no proof returns itself and ErrUnsigned.
func Split(raw []byte) (content []byte, p Proof, err error) {
	raw = bytes.TrimSpace(raw)
	i := bytes.LastIndex(raw, member)
	if i < 1 || raw[len(raw)-1] != '}' {
		return raw, Proof{}, ErrUnsigned
	}
	if err := json.Unmarshal(raw[i+len(member):len(raw)-1], &p); err != nil || p.V == 0 {
		// The proof is the document's last member, written whole: one
		// that does not decode was not written by Steward.
		return raw, Proof{}, fmt.Errorf("%w: its proof is not readable", ErrForged)
	}
	head := bytes.TrimRight(raw[:i], " \t\r\n")
	switch {
	case len(head) > 0 && head[len(head)-1] == ',':
		head = head[:len(head)-1]
	case len(head) == 1 && head[0] == '{':
	default:
		return raw, Proof{}, fmt.Errorf("%w: its proof is not where a writer puts it", ErrForged)
	}
	content = append(append([]byte(nil), head...), '}')
	return content, p, nil
}

// Opened is a document whose proof verified.
type Opened struct {
	// Content is the JSON the proof signs: decode this, never the raw
	// document, so nothing outside the signature is read.
	Content []byte
	// N is the document's counter on its key.
	N uint64
	// By is the writer.
	By string
}

// Open verifies a stored document for scope and returns its signed content
// if one of writers wrote it. A document with no proof returns its raw
// bytes as Content with an error wrapping ErrUnsigned, so a caller that
// accepts legacy documents can still read it; any other failure wraps
// ErrForged and says what did not match.
func (v *Verifier) Open(scope Scope, raw []byte, writers ...string) (Opened, error) {
	content, p, err := Split(raw)
	if err != nil {
		return Opened{Content: content}, err
	}
	if err := v.Verify(scope, p, content, writers...); err != nil {
		return Opened{}, err
	}
	return Opened{Content: content, N: p.N, By: p.By}, nil
}
