package console_test

import (
	"context"
	"crypto"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/agekey"
	"github.com/steward-dev/steward/internal/console"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/credential"
	"github.com/steward-dev/steward/workers/workertest"
)

const (
	testToken = "console-test-token-0123456789"
	testHive  = "hive-1"
)

// TestSigner is the Signer `steward serve --signing-key` provides (a
// signing.EventSigner with the rig's controller key), counting its calls.
// newRig gives it the key the rig's credential worker trusts.
type TestSigner struct {
	calls atomic.Int32
	inner *signing.EventSigner
}

// Sign signs what must be signed for any caller: the console's side is
// tested here, the token scopes with the real gate in cmd/steward.
func (s *TestSigner) Sign(ctx context.Context, _ publisher.Caller, e event.Event) (event.Event, error) {
	if !signing.MustSign(e.Type()) {
		return e, nil
	}
	s.calls.Add(1)
	return s.inner.Sign(ctx, e)
}

// HasKey implements console.Signer.
func (s *TestSigner) HasKey() bool { return true }

// rig is a console and ingress in process, on an embedded JetStream, with
// the real credential worker for testHive.
type rig struct {
	t         testing.TB
	srv       *workertest.Server
	js        jetstream.JetStream
	url       string
	recipient string
	credDir   string
	worker    *workertest.Running
	// spec and handler start the credential worker again (restart).
	spec    workers.Spec
	handler workers.Handler
	// broken makes the credential handler panic, as a bug would, so the
	// runtime dead-letters the event (WithMaxPanics(1)); clearing it is
	// deploying the fix.
	broken atomic.Bool
	// controller signs rotations, as the controller does; the credential
	// worker trusts its public key.
	controller crypto.Signer
}

func newRig(t testing.TB, signer console.Signer) *rig {
	return newRigWith(t, rigConfig{signer: signer})
}

// newRigAt is newRig with the console's clock (nil: time.Now).
func newRigAt(t testing.TB, signer console.Signer, now func() time.Time) *rig {
	return newRigWith(t, rigConfig{signer: signer, now: now})
}

// rigConfig is what a test changes of the rig's console.
type rigConfig struct {
	signer console.Signer
	// now is the console's clock (nil: time.Now).
	now func() time.Time
	// traceURL is the console's --trace-url.
	traceURL string
}

func newRigWith(t testing.TB, rc rigConfig) *rig {
	t.Helper()
	signer, now := rc.signer, rc.now
	r := &rig{t: t, srv: workertest.StartServer(t)}
	r.js = r.srv.JetStream(t)
	dir := t.TempDir()
	idPath := filepath.Join(dir, "hive.key")
	rcpt, err := agekey.Generate(idPath)
	if err != nil {
		t.Fatal(err)
	}
	r.recipient = rcpt
	r.credDir = filepath.Join(dir, "credentials")
	ctlPriv, ctlPub, err := signing.DevControllerKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if r.controller, err = signing.LoadPrivateKey(ctlPriv); err != nil {
		t.Fatal(err)
	}
	if ts, ok := signer.(*TestSigner); ok {
		if ts.inner, err = signing.NewEventSigner(r.controller); err != nil {
			t.Fatal(err)
		}
	}
	cw, err := credential.New(credential.Config{Hive: testHive, AgeIdentity: idPath, CredentialDir: r.credDir, ControllerKey: ctlPub})
	if err != nil {
		t.Fatal(err)
	}
	h := workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		if r.broken.Load() {
			panic("test: the credential handler is broken until the fix is deployed")
		}
		return cw.Handle(ctx, d)
	})
	r.spec, r.handler = cw.Spec(), h
	r.worker = workertest.Start(t, r.js, r.spec, h, workers.WithMaxPanics(1), workers.WithLogger(zerolog.Nop()))

	pub := publisher.New(r.js)
	in, err := publisher.NewIngress(pub, publisher.IngressConfig{Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	// The payload view checks envelopes with the key the credential
	// worker trusts, as the gateway gives it the workers' controller keys.
	controllerKeys, err := signing.LoadEnvelopeKeys(ctlPub)
	if err != nil {
		t.Fatal(err)
	}
	c, err := console.New(console.Config{
		Token:          testToken,
		JS:             r.js,
		Publisher:      publisher.New(r.js, publisher.WithSource(console.Source)),
		Signer:         signer,
		ControllerKeys: controllerKeys,
		TraceURL:       rc.traceURL,
		Now:            now,
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(publisher.IngressPath, in)
	c.Mount(mux)
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	r.url = ts.URL
	return r
}

// rotation publishes a valid rotation of testHive, sealed with agekey,
// past the console (as another publisher would).
func (r *rig) rotation(version int, clientID, secret string) {
	r.t.Helper()
	r.rotationTraced(version, clientID, secret, "")
}

// rotationTraced is rotation carrying the W3C trace id trace (none when
// ""), as a traced publisher sends it; it returns the event's id.
func (r *rig) rotationTraced(version int, clientID, secret, trace string) string {
	r.t.Helper()
	ct, err := agekey.Encrypt(r.recipient, []byte(secret))
	if err != nil {
		r.t.Fatal(err)
	}
	data, err := signing.SignRotation(r.controller, events.CredentialRotated{Hive: testHive, Version: uint64(version), ClientID: clientID, Secret: ct})
	if err != nil {
		r.t.Fatal(err)
	}
	e, err := events.New(events.TypeCredentialRotated, testHive, data)
	if err != nil {
		r.t.Fatal(err)
	}
	if trace != "" {
		e.SetExtension("traceparent", "00-"+trace+"-00f067aa0ba902b7-01")
	}
	return workertest.Publish(r.t, r.js, e).ID
}
