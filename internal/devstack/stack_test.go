package devstack

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/natsauth"
	"github.com/steward-dev/steward/internal/proof"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/converge"
	"github.com/steward-dev/steward/workers/workertest"
)

// credsIdentity connects with a credentials file and its .dockey, as the
// command does when no other flag is given.
type credsIdentity struct{}

func (credsIdentity) Connect(_ context.Context, name, url, creds string) (*nats.Conn, jetstream.JetStream, error) {
	raw, err := os.ReadFile(creds)
	if err != nil {
		return nil, nil, err
	}
	opts := []nats.Option{nats.Name(name), nats.UserCredentials(creds)}
	if inbox := natsauth.CredsInboxPrefix(raw); inbox != "" && inbox != "_INBOX" {
		opts = append(opts, nats.CustomInboxPrefix(inbox))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	return nc, js, err
}

func (credsIdentity) DocumentKeys(creds, by string) (*proof.Signer, *proof.Verifier, error) {
	v := proof.NewVerifier()
	if err := v.TrustIssuerOf(creds); err != nil {
		return nil, nil, err
	}
	s, err := proof.LoadSigner(proof.KeyFileFor(creds), creds, by)
	if err != nil {
		return nil, nil, err
	}
	v.Pin(by, s.Public())
	return s, v, nil
}

// echo is a worker that applies every event.
type echo struct{ spec workers.Spec }

func (e echo) Handle(context.Context, *workers.Delivery) error { return nil }
func (e echo) Spec() workers.Spec                              { return e.spec }
func (e echo) Close() error                                    { return nil }

// TestStackStartsClosedAndStopsWhole: the stack's bus is closed (a
// connection without credentials is refused, the operator's may set up),
// its gateway takes events with the token and refuses them without, a
// worker runs as its own identity while one that cannot start is reported
// and the others still run, PostgreSQL missing is said with what to do,
// and Stop frees both ports; a second stack on the same folder keeps the
// token.
func TestStackStartsClosedAndStopsWhole(t *testing.T) {
	dir := t.TempDir()
	spec := converge.SpecFor("dev")
	s := New(dir, credsIdentity{}, WithNATSListen("127.0.0.1:0"), WithHTTPListen("127.0.0.1:0"), WithPGBin(t.TempDir()),
		WithWorkers(
			Worker{Name: "echo", Dev: func(context.Context, string) (Service, []string, error) { return echo{spec}, []string{"feed it"}, nil }},
			Worker{Name: "broken", Dev: func(context.Context, string) (Service, []string, error) { return nil, nil, errors.New("no fixture") }},
		))
	t.Cleanup(func() { _ = s.Stop() })
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect(s.URL()); err == nil {
		nc.Close()
		t.Fatal("the embedded server took a connection without credentials")
	}
	if len(s.Workers) != 2 || s.Workers[0].Err != nil || s.Workers[0].Runtime == nil || s.Workers[1].Err == nil {
		t.Fatalf("workers %+v: want echo running and broken not", s.Workers)
	}
	if s.Postgres.URL != "" || s.Postgres.Why == nil || !strings.Contains(s.Postgres.Why.Error(), "--database-url") {
		t.Fatalf("postgres %+v: want none, saying what to do", s.Postgres)
	}
	base := "http://" + s.HTTP
	if code := post(t, base, ""); code != http.StatusUnauthorized {
		t.Fatalf("without the token: %d, want 401", code)
	}
	if code := post(t, base, s.Token); code != http.StatusAccepted {
		t.Fatalf("with the token: %d, want 202", code)
	}
	waitReady(t, base)
	natsAddr, httpAddr := strings.TrimPrefix(s.URL(), "nats://"), s.HTTP
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{natsAddr, httpAddr} {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Fatalf("%s still answers after Stop", addr)
		}
	}
	again := New(dir, credsIdentity{}, WithNATSListen("127.0.0.1:0"), WithHTTPListen("127.0.0.1:0"), WithPGBin(t.TempDir()))
	t.Cleanup(func() { _ = again.Stop() })
	if err := again.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if again.Token != s.Token || again.ScopedToken != s.ScopedToken || again.ScopedToken == "" {
		t.Fatalf("the second run's tokens %q %q differ from the first's %q %q", again.Token, again.ScopedToken, s.Token, s.ScopedToken)
	}
	if fi, err := os.Stat(filepath.Join(dir, TokenFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file %v %v: want mode 0600", fi, err)
	}
}

// TestStackRefuses4222: a NATS an operator may run there is left alone.
func TestStackRefuses4222(t *testing.T) {
	s := New(t.TempDir(), credsIdentity{}, WithNATSListen("127.0.0.1:4222"))
	t.Cleanup(func() { _ = s.Stop() })
	if err := s.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "4222") {
		t.Fatalf("Start on 4222: %v", err)
	}
}

func post(t *testing.T, base, token string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+publisher.IngressPath, strings.NewReader(`{"version":"1.2.3"}`))
	for k, v := range map[string]string{"ce-specversion": "1.0", "ce-type": events.TypeReleasePublished, "ce-source": "/test", "ce-id": "rel-1.2.3", "ce-subject": "1.2.3", "content-type": "application/json"} {
		req.Header.Set(k, v)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// waitReady waits until /readyz answers 200: the worker is consuming.
func waitReady(t *testing.T, base string) {
	t.Helper()
	workertest.WaitUntil(t, base+"/readyz answers 200", func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}
