package tokens

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/oklog/ulid/v2"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/proof"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/internal/strictjson"
	"github.com/steward-dev/steward/publisher"
)

// AuditWorker is the outcome subject's worker part for the ingress's
// audit events: steward.outcomes.ingress.<token> (natsauth grants a
// publisher exactly that).
const AuditWorker = "ingress"

// TypeSigned is the audit event of a signature made for a caller.
var TypeSigned = events.OutcomeType(AuditWorker, "signed")

// AuditSource is the CloudEvents source of the audit events.
const AuditSource = "/steward/ingress"

// Signed is the data of a TypeSigned audit event. It names what was signed
// and for whom, never a secret: the token by its name, the event by its id.
type Signed struct {
	Token string `json:"token"`
	// Via is where the caller came in: "ingress" or "console".
	Via  string `json:"via"`
	Type string `json:"type"`
	Key  string `json:"key"`
	// Version (credential.rotated) or Generation (grant.changed) signed.
	Version    uint64 `json:"version,omitempty"`
	Generation uint64 `json:"generation,omitempty"`
	// Base is the newest signed one stored on the key when it was signed
	// (0: none), so the window the signature used can be audited.
	Base    uint64 `json:"base"`
	EventID string `json:"eventId"`
}

// GateConfig configures a Gate.
type GateConfig struct {
	// Tokens are the scoped tokens; nil means there are none, and nothing
	// is signed for anybody.
	Tokens *Dir
	// Signer is the controller key; nil refuses the types it signs.
	Signer *signing.EventSigner
	// Controller verifies the newest event stored on a key (the window's
	// base): the signer's public key, and any others the workers trust.
	Controller *signing.KeySet
	// NC reads the newest event of a key (a direct get by subject) and
	// publishes the audit events. Required with a Signer.
	NC *nats.Conn
	// APIPrefix is the JetStream API prefix ("$JS.API", or
	// "$JS.<domain>.API"); "" is "$JS.API".
	APIPrefix string
	// Audit signs the audit events (the ingress's document key), in the
	// proof.Header header; nil sends them unsigned.
	Audit *proof.Signer
	// Log receives a line per signature and refusal (names and numbers,
	// never a token or data).
	Log zerolog.Logger
}

// Gate decides, for each validated event and the caller that sent it,
// whether it is stored, and signs what must be signed. Its Sign is the
// ingress's hook and the console's signer.
type Gate struct {
	cfg GateConfig
}

// NewGate returns the gate of cfg.
func NewGate(cfg GateConfig) (*Gate, error) {
	if cfg.Signer != nil && (cfg.NC == nil || cfg.Controller == nil) {
		return nil, errors.New("a signing gate needs the NATS connection (to read the newest signed event of a key and to audit) and the controller key set")
	}
	if cfg.APIPrefix == "" {
		cfg.APIPrefix = "$JS.API"
	}
	return &Gate{cfg: cfg}, nil
}

// HasKey reports whether the gate can sign at all (the console's forms say
// so when it cannot).
func (g *Gate) HasKey() bool { return g.cfg.Signer != nil }

// Hook is Sign as the ingress's hook.
func (g *Gate) Hook() publisher.SignHook { return g.Sign }

// Sign returns e to store, signed when its type must be, or an error
// wrapping publisher.ErrForbidden that names the state found and what to
// do next. e has been validated.
func (g *Gate) Sign(ctx context.Context, caller publisher.Caller, e event.Event) (event.Event, error) {
	typ, key := e.Type(), e.Subject()
	if signing.SignedFromRecord(typ) {
		// Only the operator's own command signs these (from the
		// controller's records); stored here unsigned, one would only be
		// a message nobody believes under the site's subject.
		return e, fmt.Errorf("%w: %s for %s is signed by the controller from the operator's records, never through an ingress, so nothing of the request was stored; publish it with steward publish --file F --signing-key CONTROLLER.key",
			publisher.ErrForbidden, short(typ), key)
	}
	if !caller.Scoped {
		if signing.MustSign(typ) {
			return e, fmt.Errorf("%w: %s for %s must be signed by the controller, and the controller key signs only for a scoped token; the unscoped ingress token may publish %s alone, so nothing of the request was stored. Ask the operator for a scoped token (steward token issue NAME --types %s --keys %s --window N)",
				publisher.ErrForbidden, short(typ), key, shortList(UnsignedTypes), typ, key)
		}
		return e, nil
	}
	if g.cfg.Tokens == nil {
		return e, fmt.Errorf("%w: token %s is not known here (no --tokens-dir), so nothing of the request was stored", publisher.ErrForbidden, caller.Token)
	}
	doc, err := g.cfg.Tokens.Current(caller.Token)
	if err != nil {
		return e, fmt.Errorf("%w: %w, so nothing of the request was stored; ask the operator for a new token", publisher.ErrForbidden, err)
	}
	if !doc.AllowsType(typ) {
		return e, fmt.Errorf("%w: token %s may publish %s; %s is not one of them, so nothing of the request was stored", publisher.ErrForbidden, doc.Name, shortList(doc.Types), short(typ))
	}
	if !doc.AllowsKey(key) {
		return e, fmt.Errorf("%w: token %s may publish %s for %ss %s; %s is not one of them, so nothing was signed or stored",
			publisher.ErrForbidden, doc.Name, short(typ), keyNoun(typ), strings.Join(doc.Keys, ", "), key)
	}
	if !signing.MustSign(typ) {
		return e, nil
	}
	if g.cfg.Signer == nil {
		return e, fmt.Errorf("%w: %s for %s must be signed by the controller (docs/design.md §7: desired state that hands out access is accepted only signed), and this ingress has no --signing-key, so nothing of the request was stored; start steward serve with --signing-key, or publish it with steward publish --signing-key",
			publisher.ErrForbidden, typ, key)
	}
	n, err := numberOf(e)
	if err != nil {
		return e, err
	}
	base, err := g.newestSigned(ctx, typ, key)
	if err != nil {
		return e, err
	}
	if n <= base || n-base > doc.Window {
		return e, fmt.Errorf("%w: token %s may have %ss of %s signed from %d to %d (the newest signed %s stored is %d, the window %d); %d is outside it, so nothing was signed or stored. A larger step is the operator's: steward publish --signing-key from the controller's source of truth",
			publisher.ErrForbidden, doc.Name, numberNoun(typ), key, base+1, satAdd(base, doc.Window), numberNoun(typ), base, doc.Window, n)
	}
	signed, err := g.cfg.Signer.Sign(ctx, e)
	if err != nil {
		return e, fmt.Errorf("%w; nothing of the request was stored", err)
	}
	// Audited before it is stored: a signature nobody can account for is
	// never made, and an audit whose event then failed to store says so
	// by its id not being in the stream.
	audit := Signed{Token: doc.Name, Via: caller.Via, Type: typ, Key: key, Base: base, EventID: e.ID()}
	if typ == events.TypeGrantChanged {
		audit.Generation = n
	} else {
		audit.Version = n
	}
	if err := g.audit(ctx, audit); err != nil {
		return e, fmt.Errorf("%w: the audit event of signing %s for %s could not be stored (%v), so nothing was signed or stored; sending the request again is safe", publisher.ErrUnavailable, short(typ), key, err)
	}
	g.cfg.Log.Info().Str("token", doc.Name).Str("via", caller.Via).Str("type", typ).Str("key", key).Uint64("number", n).Uint64("base", base).Str("id", e.ID()).Msg("signed for a caller")
	return signed, nil
}

// numberOf is the version or generation e asks to have signed.
func numberOf(e event.Event) (uint64, error) {
	switch e.Type() {
	case events.TypeGrantChanged:
		var d events.GrantChanged
		if err := strictjson.Decode(e.Data(), &d); err != nil {
			return 0, fmt.Errorf("event %s: %w", e.ID(), err)
		}
		return d.Generation, nil
	case events.TypeCredentialRotated:
		var d events.CredentialRotated
		if err := strictjson.Decode(e.Data(), &d); err != nil {
			return 0, fmt.Errorf("event %s: %w", e.ID(), err)
		}
		return d.Version, nil
	}
	return 0, fmt.Errorf("%s is not a type the controller signs", e.Type())
}

// newestSigned is the version or generation of the newest event stored on
// key's subject, verified with the controller keys; 0 when none is
// stored. When the newest is not signed (anyone who may publish can store
// one), the ingress cannot tell where the signed ones stand without
// reading further back than a publisher may (last-by-subject is the one
// read it is granted), so it signs nothing for the key until the operator
// republishes it signed.
func (g *Gate) newestSigned(ctx context.Context, typ, key string) (uint64, error) {
	k, _ := events.Lookup(typ)
	subject, err := k.SubjectFor(key)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := g.cfg.NC.RequestWithContext(ctx, g.cfg.APIPrefix+".DIRECT.GET."+events.StreamEvents+"."+subject, nil)
	if err != nil {
		return 0, fmt.Errorf("%w: the newest event of %s could not be read from %s (%v), so nothing was signed; retry when NATS answers", publisher.ErrUnavailable, key, events.StreamEvents, err)
	}
	switch m.Header.Get("Status") {
	case "":
	case "404":
		return 0, nil
	default:
		return 0, fmt.Errorf("%w: reading the newest event of %s from %s was answered %s %s, so nothing was signed (the publisher's credentials need the direct get natsauth grants; issue them again with steward creds issue publisher)",
			publisher.ErrUnavailable, key, events.StreamEvents, m.Header.Get("Status"), m.Header.Get("Description"))
	}
	seq := m.Header.Get(nats.JSSequence)
	stored, err := events.Decode(m.Header, m.Data)
	if err == nil {
		var n uint64
		if n, err = g.verified(stored, key); err == nil {
			return n, nil
		}
	}
	return 0, fmt.Errorf("%w: the newest event stored on %s %s (sequence %s) is not signed by the controller (%v), so the ingress cannot tell where its signed %ss stand and signs nothing for it; the operator republishes %s's desired state from the controller's source of truth (steward publish --file desired.jsonl --signing-key controller.key --yes), after which callers are signed for again",
		publisher.ErrForbidden, keyNoun(typ), key, seq, err, numberNoun(typ), key)
}

// verified is the signed number of a stored event, bound to key.
func (g *Gate) verified(e event.Event, key string) (uint64, error) {
	switch e.Type() {
	case events.TypeGrantChanged:
		var d events.GrantChanged
		if err := json.Unmarshal(e.Data(), &d); err != nil {
			return 0, err
		}
		p, err := signing.OpenGrant(g.cfg.Controller, d)
		if err != nil {
			return 0, err
		}
		if p.Machine != key {
			return 0, fmt.Errorf("it is signed for machine %s", p.Machine)
		}
		return p.Generation, nil
	case events.TypeCredentialRotated:
		var d events.CredentialRotated
		if err := json.Unmarshal(e.Data(), &d); err != nil {
			return 0, err
		}
		p, err := signing.OpenRotation(g.cfg.Controller, d)
		if err != nil {
			return 0, err
		}
		if p.Hive != key {
			return 0, fmt.Errorf("it is signed for hive %s", p.Hive)
		}
		return p.Version, nil
	}
	return 0, fmt.Errorf("it is a %s", e.Type())
}

// audit publishes a on steward.outcomes.ingress.<token> and waits for the
// stream to store it.
func (g *Gate) audit(ctx context.Context, a Signed) error {
	// Built by hand: an audit event is no desired state, so it is not in
	// events' catalog of types (events.New refuses it).
	e := event.New()
	e.SetType(TypeSigned)
	e.SetSubject(a.Token)
	if err := e.SetData(events.ContentTypeJSON, a); err != nil {
		return err
	}
	e.SetID(ulid.Make().String())
	e.SetSource(AuditSource)
	e.SetTime(time.Now().UTC())
	subject := events.OutcomeSubject(AuditWorker, a.Token)
	msg, err := events.Encode(subject, e)
	if err != nil {
		return err
	}
	if g.cfg.Audit != nil {
		p := g.cfg.Audit.AppendProof(nil, proof.Scope{Bucket: events.StreamOutcomes, Key: subject}, 1, msg.Data)
		msg.Header.Set(proof.Header, string(p))
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	reply, err := g.cfg.NC.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return err
	}
	var ack struct {
		Stream string `json:"stream"`
		Error  *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(reply.Data, &ack); err != nil {
		return fmt.Errorf("the answer on %s is not a stream's acknowledgement", subject)
	}
	if ack.Error != nil {
		return errors.New(ack.Error.Description)
	}
	if ack.Stream != events.StreamOutcomes {
		return fmt.Errorf("%s was stored by stream %q, not %s", subject, ack.Stream, events.StreamOutcomes)
	}
	return nil
}

// short is a type as operators say it: grant.changed.
func short(typ string) string {
	return strings.TrimSuffix(strings.TrimPrefix(typ, "dev.steward."), ".v1")
}

func shortList(types []string) string {
	out := make([]string, len(types))
	for i, t := range types {
		out[i] = short(t)
	}
	return strings.Join(out, ", ")
}

// keyNoun is what a key of typ is.
func keyNoun(typ string) string {
	switch typ {
	case events.TypeGrantChanged:
		return "machine"
	case events.TypeCredentialRotated:
		return "hive"
	case events.TypeInvitationWritten:
		return "box"
	case events.TypeReleasePublished:
		return "version"
	}
	return "key"
}

func numberNoun(typ string) string {
	if typ == events.TypeGrantChanged {
		return "generation"
	}
	return "version"
}

func satAdd(a, b uint64) uint64 {
	if a+b < a {
		return ^uint64(0)
	}
	return a + b
}
