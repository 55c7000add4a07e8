// Package tokens is who may have what signed through the ingress and the
// console (docs/design.md §7, "Signing is scoped").
//
// The controller key signs desired state that hands out access. Before
// this package, anyone holding the one ingress token (every pipeline, and
// the console's login) could have any grant or rotation signed, at any
// generation. Now a caller holds a scoped token: a random secret whose
// SHA-256 is named by a token document the operator signed with their
// document key (internal/proof). The document says which event types the
// token may publish, which keys (hives, machines; exact or a prefix
// ending in *), and how far above the newest signed event stored on the
// key a version or generation may go (the window). The ingress keeps the
// documents in a folder it re-reads on every request, so removing one
// (steward token revoke) ends its signing at once, without a restart.
//
// Gate is the ingress's signing hook (publisher.IngressConfig.Sign) and
// the console's signer, so both decide the same way, and every signature
// it makes is an audit event on steward.outcomes.ingress.<token>.
package tokens

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/atomicfile"
	"github.com/steward-dev/steward/internal/proof"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/internal/strictjson"
	"github.com/steward-dev/steward/publisher"
)

// Bucket is the scope a token document is sealed for (proof.Scope.Bucket;
// the key is the token's name), so no other signed document of the
// operator's can pass for a token document, nor one token's for another's.
const Bucket = "steward-tokens"

// Writer is the only identity whose token documents are believed.
const Writer = events.OperatorWriter

// Ext ends the file name of a token document in its folder: <name>.json.
const Ext = ".json"

// UnsignedTypes are what the unscoped ingress token may still publish:
// types the controller key never signs (they carry their own signatures by
// other keys, or none).
var UnsignedTypes = []string{events.TypeReleasePublished, events.TypeInvitationWritten, events.TypeHostFloorPublished}

// Document is a scoped token as the operator issued it. It holds no secret:
// the token itself is known only by its SHA-256.
type Document struct {
	// V is the format, 1.
	V int `json:"v"`
	// Name names the token; it is a key (one subject token), since the
	// audit subject ends with it.
	Name string `json:"name"`
	// TokenSHA256 is the hex SHA-256 of the secret.
	TokenSHA256 string `json:"tokenSHA256"`
	// Types are the CloudEvents types it may publish.
	Types []string `json:"types"`
	// Keys are the keys it may publish for: exact keys, or prefixes ending
	// in "*" ("db-*"; "*" is any key).
	Keys []string `json:"keys"`
	// Window is how far above the newest signed version or generation
	// stored on a key the token may have one signed: base+1 to
	// base+Window. Required (at least 1) when Types holds a signed type.
	Window uint64 `json:"window"`
	// IssuedAt is when it was issued, RFC 3339.
	IssuedAt string `json:"issuedAt"`
	// Expires, RFC 3339, ends it; empty is never.
	Expires string `json:"expires,omitempty"`
}

// Check says what is wrong with d, naming the field and the rule.
func (d Document) Check() error {
	if d.V != 1 {
		return fmt.Errorf("token document format %d is not 1", d.V)
	}
	if err := events.CheckKey(d.Name); err != nil {
		return fmt.Errorf("token name: %w", err)
	}
	if raw, err := hex.DecodeString(d.TokenSHA256); err != nil || len(raw) != sha256.Size {
		return fmt.Errorf("token %s: tokenSHA256 is not 64 hex digits", d.Name)
	}
	if len(d.Types) == 0 {
		return fmt.Errorf("token %s: types is empty; name the event types it may publish", d.Name)
	}
	for _, typ := range d.Types {
		if _, ok := events.Lookup(typ); !ok {
			return fmt.Errorf("token %s: type %q is not a Steward event type", d.Name, typ)
		}
		if signing.SignedFromRecord(typ) {
			return fmt.Errorf("token %s: type %s is published by the operator alone (steward publish --signing-key), never through an ingress token", d.Name, typ)
		}
	}
	if len(d.Keys) == 0 {
		return fmt.Errorf("token %s: keys is empty; name the hives or machines it may publish for (or * for any)", d.Name)
	}
	for _, k := range d.Keys {
		if err := events.CheckKey(strings.TrimSuffix(k, "*")); err != nil && k != "*" {
			return fmt.Errorf("token %s: key %q is neither a key nor a prefix ending in *: %w", d.Name, k, err)
		}
	}
	if slices.ContainsFunc(d.Types, signing.MustSign) && d.Window == 0 {
		return fmt.Errorf("token %s: window is 0, and it may publish types the controller signs; give how far above the newest signed version or generation it may go (--window)", d.Name)
	}
	if _, err := time.Parse(time.RFC3339, d.IssuedAt); err != nil {
		return fmt.Errorf("token %s: issuedAt is not RFC 3339", d.Name)
	}
	if d.Expires != "" {
		if _, err := time.Parse(time.RFC3339, d.Expires); err != nil {
			return fmt.Errorf("token %s: expires is not RFC 3339", d.Name)
		}
	}
	return nil
}

// AllowsType reports whether the token may publish events of typ.
func (d Document) AllowsType(typ string) bool { return slices.Contains(d.Types, typ) }

// AllowsKey reports whether the token may publish for key.
func (d Document) AllowsKey(key string) bool {
	for _, k := range d.Keys {
		if p, ok := strings.CutSuffix(k, "*"); ok && strings.HasPrefix(key, p) || k == key {
			return true
		}
	}
	return false
}

// Expired reports whether the token has expired at now.
func (d Document) Expired(now time.Time) bool {
	if d.Expires == "" {
		return false
	}
	t, err := time.Parse(time.RFC3339, d.Expires)
	return err != nil || !now.Before(t)
}

// NewSecret is a new token: 32 random bytes, base64url, with a prefix
// that says what it is when one turns up in a paste.
func NewSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24)
	return "stw_" + base64.RawURLEncoding.EncodeToString(b)
}

// HashSecret is the TokenSHA256 of secret.
func HashSecret(secret string) string {
	sum := sha256.Sum256([]byte(strings.TrimSpace(secret)))
	return hex.EncodeToString(sum[:])
}

// Seal signs d as the operator's document.
func Seal(s *proof.Signer, d Document) ([]byte, error) {
	if s == nil || s.By() != Writer {
		return nil, errors.New("token documents are signed with the operator's document key: run steward token as the operator (--nats-creds with operator.creds and its .dockey, or --document-key)")
	}
	if err := d.Check(); err != nil {
		return nil, err
	}
	raw, err := json.Marshal(d)
	if err != nil {
		return nil, err
	}
	return s.Seal(proof.Scope{Bucket: Bucket, Key: d.Name}, 1, raw)
}

// Open verifies a token document stored as name and decodes it strictly.
func Open(v *proof.Verifier, name string, raw []byte) (Document, error) {
	o, err := v.Open(proof.Scope{Bucket: Bucket, Key: name}, raw, Writer)
	if err != nil {
		return Document{}, fmt.Errorf("token document %s %w", name, err)
	}
	var d Document
	if err := strictjson.Decode(o.Content, &d); err != nil {
		return Document{}, fmt.Errorf("token document %s: %w", name, err)
	}
	if d.Name != name {
		return Document{}, fmt.Errorf("token document %s names token %s", name, d.Name)
	}
	if err := d.Check(); err != nil {
		return Document{}, err
	}
	return d, nil
}

// Dir is the folder of token documents the ingress reads (--tokens-dir).
// It is read again on every authentication, so a document removed or
// replaced counts from the next request.
type Dir struct {
	path string
	v    *proof.Verifier
	now  func() time.Time
	mu   sync.Mutex
	// opened caches verified documents by the SHA-256 of their bytes:
	// the folder is read each time, a signature checked only once.
	opened map[[sha256.Size]byte]Document
}

// OpenDir reads token documents from path, believing those v verifies as
// the operator's.
func OpenDir(path string, v *proof.Verifier) (*Dir, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("tokens folder: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("tokens folder %s is not a folder", path)
	}
	return &Dir{path: path, v: v, now: time.Now, opened: map[[sha256.Size]byte]Document{}}, nil
}

// SetClock sets the clock expiry is judged by (tests).
func (d *Dir) SetClock(now func() time.Time) { d.now = now }

// Path is the folder.
func (d *Dir) Path() string { return d.path }

// Entry is one file of the folder: its document, or why it is not
// believed.
type Entry struct {
	Name string
	Doc  Document
	Err  error
}

// PathOf is where the document of token name is kept.
func PathOf(dir, name string) string { return filepath.Join(dir, name+Ext) }

// Write stores a sealed document for name (atomically; it holds no secret,
// so it is readable by the ingress's group).
func Write(dir, name string, sealed []byte) error {
	if err := events.CheckKey(name); err != nil {
		return fmt.Errorf("token name: %w", err)
	}
	return atomicfile.Write(PathOf(dir, name), sealed, 0o640)
}

// Revoke removes token name's document, which ends its use at the
// ingress's next request.
func Revoke(dir, name string) error {
	if err := events.CheckKey(name); err != nil {
		return fmt.Errorf("token name: %w", err)
	}
	if err := os.Remove(PathOf(dir, name)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("no token %s in %s (steward token ls --dir %s lists them): %w", name, dir, dir, err)
		}
		return fmt.Errorf("revoke token %s: %w", name, err)
	}
	return atomicfile.SyncDir(dir)
}

// List reads every document of the folder, sorted by name.
func (d *Dir) List() ([]Entry, error) {
	files, err := os.ReadDir(d.path)
	if err != nil {
		return nil, fmt.Errorf("tokens folder: %w", err)
	}
	var out []Entry
	for _, f := range files {
		name, ok := strings.CutSuffix(f.Name(), Ext)
		if !ok || f.IsDir() || strings.HasPrefix(f.Name(), ".") {
			continue
		}
		out = append(out, d.entry(name))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (d *Dir) entry(name string) Entry {
	raw, err := os.ReadFile(PathOf(d.path, name))
	if err != nil {
		return Entry{Name: name, Err: err}
	}
	sum := sha256.Sum256(raw)
	d.mu.Lock()
	doc, ok := d.opened[sum]
	d.mu.Unlock()
	if ok {
		return Entry{Name: name, Doc: doc}
	}
	doc, err = Open(d.v, name, raw)
	if err != nil {
		return Entry{Name: name, Err: err}
	}
	d.mu.Lock()
	d.opened[sum] = doc
	d.mu.Unlock()
	return Entry{Name: name, Doc: doc}
}

// Authenticate implements publisher.Tokens: the current (verified, not
// expired) document whose TokenSHA256 is the token's. Every document is
// compared, in constant time, whatever matched before it.
func (d *Dir) Authenticate(token string) (publisher.Caller, bool) {
	list, err := d.List()
	if err != nil {
		return publisher.Caller{}, false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(token)))
	now := d.now()
	var match string
	for _, e := range list {
		want, err := hex.DecodeString(e.Doc.TokenSHA256)
		if e.Err != nil || err != nil || len(want) != sha256.Size {
			continue
		}
		if subtle.ConstantTimeCompare(got[:], want) == 1 && !e.Doc.Expired(now) {
			match = e.Name
		}
	}
	if match == "" {
		return publisher.Caller{}, false
	}
	return publisher.Caller{Token: match, Scoped: true}, true
}

// Current is token name's document as it stands now: read again, verified,
// and not expired. A caller authenticated earlier (a console session, a
// request in flight) is judged by it, so a revocation ends its signing too.
func (d *Dir) Current(name string) (Document, error) {
	e := d.entry(name)
	switch {
	case errors.Is(e.Err, fs.ErrNotExist):
		return Document{}, fmt.Errorf("token %s has been revoked (its document is no longer in %s)", name, d.path)
	case e.Err != nil:
		return Document{}, fmt.Errorf("token %s is not believed: %w", name, e.Err)
	case e.Doc.Expired(d.now()):
		return Document{}, fmt.Errorf("token %s expired at %s", name, e.Doc.Expires)
	}
	return e.Doc, nil
}
