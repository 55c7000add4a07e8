package credential_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/agekey"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers/credential"
	"github.com/steward-dev/steward/workers/workertest"
)

// Issue 12: a hive's age recipient is public, so before rotations were
// signed anyone who could publish could install a pair of their own, and a
// version of 2^64-1 then made every real rotation stale for ever. Each test
// here is one such attack, and each fails on a worker that believes an
// unsigned or unbound version.

// signedHive is a credential worker of hive-a that verifies with the keys
// of controllerKeys (one file, or several separated by commas).
type signedHive struct {
	w         *credential.Worker
	recipient string
	dir       string
}

func newSignedHive(t *testing.T, controllerKeys string) *signedHive {
	t.Helper()
	base := t.TempDir()
	id := filepath.Join(base, "hive.key")
	recipient, err := agekey.Generate(id)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "files")
	w, err := credential.New(credential.Config{Hive: "hive-a", AgeIdentity: id, CredentialDir: dir, ControllerKey: controllerKeys})
	if err != nil {
		t.Fatal(err)
	}
	return &signedHive{w: w, recipient: recipient, dir: dir}
}

func (h *signedHive) rotation(t *testing.T, version uint64, clientID, secret string) events.CredentialRotated {
	t.Helper()
	ct, err := agekey.Encrypt(h.recipient, []byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	return events.CredentialRotated{Hive: "hive-a", Version: version, ClientID: clientID, Secret: ct}
}

func rotationEvent(t *testing.T, data events.CredentialRotated) event.Event {
	t.Helper()
	e, err := events.New(events.TypeCredentialRotated, data.Hive, data)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func (h *signedHive) replay(t *testing.T, list ...events.CredentialRotated) *workertest.Result {
	t.Helper()
	var evs []event.Event
	for _, d := range list {
		evs = append(evs, rotationEvent(t, d))
	}
	return workertest.Replay(t, evs, h.w.Spec(), h.w)
}

func (h *signedHive) pair(t *testing.T) (clientID, secret string) {
	t.Helper()
	c, s, err := readPair(h.dir)
	if err != nil {
		t.Fatalf("read the pair: %v", err)
	}
	return c, s
}

// attackerKey is an ed25519 key pair of the attacker's own, written as
// `steward keys` writes one.
func attackerKey(t *testing.T) (priv, pub string) {
	t.Helper()
	dir := t.TempDir()
	priv, pub = filepath.Join(dir, "attacker.key"), filepath.Join(dir, "attacker.pub")
	if err := signing.GenerateKeyPair(signing.Ed25519, priv, pub); err != nil {
		t.Fatal(err)
	}
	return priv, pub
}

// refusedAs checks that the refused outcome names the rule and says what
// was found and that nothing was written, and that no secret is in it.
func refusedAs(t *testing.T, r *workertest.Result, rule string, secrets ...string) {
	t.Helper()
	ref := workertest.OutcomeAs[credential.Refused](r, credential.OutcomeRefused)
	if ref.Rule != rule || !strings.Contains(ref.Reason, "nothing was written") || !strings.Contains(ref.Reason, "republish it signed") {
		t.Errorf("refused %+v; want rule %q, saying nothing was written and to republish it signed", ref, rule)
	}
	for _, s := range secrets {
		if strings.Contains(ref.Reason, s) || (r.Err() != nil && strings.Contains(r.Err().Error(), s)) {
			t.Errorf("a secret is in the refusal: %q", ref.Reason)
		}
	}
}

// TestAttackUnsignedHugeVersionTakesNothing is the attack on a
// hive: one rotation with version 2^64-1 and the attacker's pair,
// encrypted to the hive's public recipient, unsigned. It must install
// nothing, supersede nothing queued with it, and leave every later signed
// rotation applicable.
func TestAttackUnsignedHugeVersionTakesNothing(t *testing.T) {
	h := newSignedHive(t, controllerPub)
	first := h.replay(t, signed(t, h.rotation(t, 1, "client-1", "real-secret-1")))
	first.AssertVerdicts(workertest.Applied)

	forged := h.rotation(t, math.MaxUint64, "attacker-client", "attacker-secret")
	// The real rotation is queued ahead of the forged one: were the
	// forged version ranked, the real one would be superseded unapplied.
	r := h.replay(t, signed(t, h.rotation(t, 2, "client-2", "real-secret-2")), forged)
	r.AssertVerdicts(workertest.Applied, workertest.Refused)
	r.AssertOutcomes(credential.OutcomeApplied, credential.OutcomeRefused)
	r.AssertDeadLetters()
	refusedAs(t, r, signing.RuleUnsigned, "attacker-secret", "real-secret")
	if ref := workertest.OutcomeAs[credential.Refused](r, credential.OutcomeRefused); !strings.Contains(ref.Reason, "rotation 18446744073709551615 for hive hive-a is not signed by the controller") {
		t.Errorf("reason %q does not say which rotation is unsigned", ref.Reason)
	}
	if c, s := h.pair(t); c != "client-2" || s != "real-secret-2" {
		t.Fatalf("the pair is %q after the forged rotation; want the controller's client-2", c)
	}

	// Not pinned: the controller's next version applies.
	next := h.replay(t, signed(t, h.rotation(t, 3, "client-3", "real-secret-3")))
	next.AssertVerdicts(workertest.Applied)
	if c, _ := h.pair(t); c != "client-3" {
		t.Fatalf("client_id %q; the forged version pinned the hive", c)
	}
}

// TestAttackForgedSignatureHugeVersion signs the attacker's huge version
// with the attacker's own key: a signature, but not the controller's.
func TestAttackForgedSignatureHugeVersion(t *testing.T) {
	h := newSignedHive(t, controllerPub)
	atkPriv, _ := attackerKey(t)
	forged := signedWith(t, atkPriv, h.rotation(t, math.MaxUint64, "attacker-client", "attacker-secret"))
	r := h.replay(t, forged, signed(t, h.rotation(t, 1, "client-1", "real-secret-1")))
	r.AssertVerdicts(workertest.Refused, workertest.Applied)
	r.AssertOutcomes(credential.OutcomeRefused, credential.OutcomeApplied)
	refusedAs(t, r, signing.RuleSignature, "attacker-secret")
	if c, _ := h.pair(t); c != "client-1" {
		t.Fatalf("client_id %q, want the controller's client-1", c)
	}
}

// TestAttackFieldsSwappedUnderARealSignature keeps a real envelope and
// changes what it vouches for: the version raised to 2^64-1, the secret or
// client id swapped for the attacker's, the hive renamed, an envelope of
// another kind. Each is refused and the files stay as they were; the
// genuine rotation still applies after them.
func TestAttackFieldsSwappedUnderARealSignature(t *testing.T) {
	h := newSignedHive(t, controllerPub)
	real := signed(t, h.rotation(t, 2, "client-2", "real-secret-2"))
	attacker := h.rotation(t, 2, "attacker-client", "attacker-secret")
	otherHive := signed(t, events.CredentialRotated{Hive: "hive-b", Version: 5, ClientID: "client-b", Secret: real.Secret})

	ck, err := signing.LoadPrivateKey(controllerKey)
	if err != nil {
		t.Fatal(err)
	}
	// A controller signature over the same bytes as another kind of
	// document, relabelled as a rotation: DSSE signs the payload type too.
	otherKind, err := signing.SignEnvelope(ck, events.PayloadTypeGrant, mustDecode(t, real.Envelope.Payload))
	if err != nil {
		t.Fatal(err)
	}
	otherKind.PayloadType = events.PayloadTypeRotation

	cases := map[string]func(d *events.CredentialRotated){
		"huge version":    func(d *events.CredentialRotated) { d.Version = math.MaxUint64 },
		"attacker secret": func(d *events.CredentialRotated) { d.Secret = attacker.Secret },
		"attacker client": func(d *events.CredentialRotated) { d.ClientID = attacker.ClientID },
		"another hive's":  func(d *events.CredentialRotated) { *d = otherHive; d.Hive = "hive-a" },
		"another kind":    func(d *events.CredentialRotated) { d.Envelope = &otherKind },
		"another's signature": func(d *events.CredentialRotated) {
			env := *d.Envelope
			env.Signatures = otherHive.Envelope.Signatures
			d.Envelope = &env
		},
		"payload replaced": func(d *events.CredentialRotated) {
			env := *d.Envelope
			env.Payload = attackerPayload(t, d)
			d.Envelope = &env
		},
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			data := real
			mutate(&data)
			r := h.replay(t, data)
			r.AssertVerdicts(workertest.Refused)
			r.AssertOutcomes(credential.OutcomeRefused)
			if ref := workertest.OutcomeAs[credential.Refused](r, credential.OutcomeRefused); ref.Rule == "" || ref.Rule == signing.RuleUnsigned {
				t.Errorf("rule %q; want the signature, payload or binding rule", ref.Rule)
			}
			refusedAs(t, r, workertest.OutcomeAs[credential.Refused](r, credential.OutcomeRefused).Rule, "attacker-secret", "real-secret")
			if _, err := os.Lstat(filepath.Join(h.dir, credential.DataLink)); err == nil {
				t.Fatal("a pair was written")
			}
		})
	}
	r := h.replay(t, real)
	r.AssertVerdicts(workertest.Applied)
	if c, s := h.pair(t); c != "client-2" || s != "real-secret-2" {
		t.Fatalf("client_id %q after the genuine rotation", c)
	}
}

func mustDecode(t *testing.T, b64 string) []byte {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// attackerPayload is a rotation payload the attacker would like signed,
// put in place of the signed one.
func attackerPayload(t *testing.T, d *events.CredentialRotated) string {
	t.Helper()
	p := signing.RotationPayload(*d)
	p.Version = math.MaxUint64
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	env, err := signing.SignEnvelope(priv, events.PayloadTypeRotation, []byte(`{"v":1,"hive":"hive-a","version":18446744073709551615,"clientId":"`+p.ClientID+`","secretSHA256":"`+p.SecretSHA256+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	return env.Payload
}

// TestControllerKeyRotatesThroughASet rotates the controller key as the
// README says: add the new key beside the old (a comma-separated list, or
// both blocks in one PEM file), sign with the new one, then remove the
// old. During the overlap both verify; after it the old key's signature
// is refused.
func TestControllerKeyRotatesThroughASet(t *testing.T) {
	newPriv, newPub := attackerKey(t) // a fresh controller key
	both := newSignedHive(t, controllerPub+","+newPub)
	r := both.replay(t, signed(t, both.rotation(t, 1, "client-1", "s-1")))
	r.AssertVerdicts(workertest.Applied)
	r = both.replay(t, signedWith(t, newPriv, both.rotation(t, 2, "client-2", "s-2")))
	r.AssertVerdicts(workertest.Applied)

	// One PEM file with both blocks is the same set.
	oldPEM, _ := os.ReadFile(controllerPub)
	newPEM, _ := os.ReadFile(newPub)
	set := filepath.Join(t.TempDir(), "controller-set.pub")
	if err := os.WriteFile(set, append(oldPEM, newPEM...), 0o644); err != nil {
		t.Fatal(err)
	}
	ks, err := signing.LoadEnvelopeKeys(set)
	if err != nil || ks.Len() != 2 {
		t.Fatalf("a PEM file of two keys: %v keys, %v", ks, err)
	}

	// The old key removed: what it signs counts no more.
	after := newSignedHive(t, newPub)
	r = after.replay(t, signed(t, after.rotation(t, 7, "client-7", "s-7")), signedWith(t, newPriv, after.rotation(t, 3, "client-3", "s-3")))
	r.AssertVerdicts(workertest.Refused, workertest.Applied)
	refusedAs(t, r, signing.RuleSignature)
	if c, _ := after.pair(t); c != "client-3" {
		t.Fatalf("client_id %q, want client-3 signed by the new key", c)
	}
}

// TestResetAfterASignedMistake: the controller itself signed version
// 2^64-1 by mistake, so every later rotation is stale. The documented
// reset (remove <credential-dir>/..data) lets the controller's current,
// lower version apply again, and the mistaken pair is cleaned up.
func TestResetAfterASignedMistake(t *testing.T) {
	h := newSignedHive(t, controllerPub)
	r := h.replay(t, signed(t, h.rotation(t, math.MaxUint64, "client-mistake", "s-mistake")))
	r.AssertVerdicts(workertest.Applied)
	r = h.replay(t, signed(t, h.rotation(t, 3, "client-3", "s-3")))
	r.AssertOutcomes(credential.OutcomeSkipped)

	if err := os.Remove(filepath.Join(h.dir, credential.DataLink)); err != nil {
		t.Fatal(err)
	}
	r = h.replay(t, signed(t, h.rotation(t, 3, "client-3", "s-3")))
	r.AssertVerdicts(workertest.Applied)
	if c, s := h.pair(t); c != "client-3" || s != "s-3" {
		t.Fatalf("client_id %q after the reset", c)
	}
	entries, _ := os.ReadDir(h.dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "..v18446744073709551615-") {
			t.Errorf("the mistaken version folder %s is still there", e.Name())
		}
	}
	r = h.replay(t, signed(t, h.rotation(t, 2, "client-2", "s-2")))
	r.AssertOutcomes(credential.OutcomeSkipped)
}

// TestEventsStoredBeforeSigningAreRefusedAsUnsigned replays the stream
// recorded before rotations were signed (testdata/rotations-unsigned.jsonl):
// every rotation in it is refused as unsigned, none supersedes another,
// and nothing is written. testdata/rotations.jsonl is the same stream as
// the controller republishes it signed.
func TestEventsStoredBeforeSigningAreRefusedAsUnsigned(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "credentials")
	w, err := credential.New(credential.Config{Hive: "hive-1", AgeIdentity: "testdata/hive-1.agekey", CredentialDir: dir, ControllerKey: controllerPub})
	if err != nil {
		t.Fatal(err)
	}
	r := workertest.ReplayFile(t, "testdata/rotations-unsigned.jsonl", w.Spec(), w)
	r.AssertVerdicts(workertest.Refused, workertest.Refused, workertest.Refused, workertest.Refused)
	r.AssertOutcomes(credential.OutcomeRefused, credential.OutcomeRefused, credential.OutcomeRefused, credential.OutcomeRefused)
	r.AssertDeadLetters()
	for _, o := range r.Outcomes {
		if ref := workertest.DataAs[credential.Refused](t, o, events.OutcomeType(credential.Name, credential.OutcomeRefused)); ref.Rule != signing.RuleUnsigned {
			t.Errorf("refused %+v, want the unsigned rule", ref)
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, credential.DataLink)); err == nil {
		t.Fatal("an unsigned rotation was written")
	}
}

// TestNewNeedsAControllerKey: a worker that cannot verify rotations does
// not start, rather than refusing every rotation or accepting any.
func TestNewNeedsAControllerKey(t *testing.T) {
	base := t.TempDir()
	id := filepath.Join(base, "hive.key")
	if _, err := agekey.Generate(id); err != nil {
		t.Fatal(err)
	}
	priv, _ := attackerKey(t)
	for name, c := range map[string]struct{ keys, want string }{
		"none":              {"", "--controller-key is required"},
		"missing file":      {filepath.Join(base, "nope.pub"), "--controller-key"},
		"a private key":     {priv, "not a PUBLIC KEY"},
		"an age identity":   {id, "no PEM"},
		"one of two absent": {controllerPub + "," + filepath.Join(base, "nope.pub"), "--controller-key"},
	} {
		_, err := credential.New(credential.Config{Hive: "h", AgeIdentity: id, CredentialDir: filepath.Join(base, "files"), ControllerKey: c.keys})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want an error with %q", name, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "PRIVATE KEY-----") {
			t.Errorf("%s: the error quotes the key", name)
		}
	}
}
