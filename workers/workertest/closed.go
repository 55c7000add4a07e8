package workertest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/internal/natsauth"
	"github.com/steward-dev/steward/internal/proof"
	"github.com/steward-dev/steward/workers"
)

// ClosedServer is an embedded JetStream server on a closed bus, configured
// as steward dev configures its own: JWT authentication from an authority
// made in a temporary folder, every identity issued its credentials and
// document key as `steward creds issue` issues them. It is for tests that
// must hold under the real permission table, above all the attacks.
type ClosedServer struct {
	*Server
	Authority *natsauth.Authority
	dir       string
}

// StartClosedServer starts a closed bus on a free 127.0.0.1 port.
func StartClosedServer(t testing.TB) *ClosedServer {
	t.Helper()
	dir := t.TempDir()
	a, err := natsauth.LoadOrCreate(filepath.Join(dir, "auth"))
	if err != nil {
		t.Fatal(err)
	}
	opts := &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: filepath.Join(dir, "js"), NoLog: true, NoSigs: true}
	if err := a.Configure(opts); err != nil {
		t.Fatal(err)
	}
	s := &Server{opts: opts}
	s.start(t)
	t.Cleanup(s.Shutdown)
	return &ClosedServer{Server: s, Authority: a, dir: dir}
}

// Creds issues id's credentials (and its document key beside them, kept
// when it exists) and returns the credentials file's path.
func (c *ClosedServer) Creds(t testing.TB, id natsauth.Identity) string {
	t.Helper()
	path := filepath.Join(c.dir, id.Name()+".creds")
	if err := c.Authority.WriteCreds(path, id); err != nil {
		t.Fatal(err)
	}
	return path
}

// ConnectAs connects as id, with the inbox prefix its credentials allow,
// as every Steward process does.
func (c *ClosedServer) ConnectAs(t testing.TB, id natsauth.Identity) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	path := c.Creds(t, id)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	opts := []nats.Option{nats.UserCredentials(path), nats.Name(id.Name())}
	if p := natsauth.CredsInboxPrefix(raw); p != "" {
		opts = append(opts, nats.CustomInboxPrefix(p))
	}
	nc, err := nats.Connect(c.ClientURL(), opts...)
	if err != nil {
		t.Fatalf("connect as %s: %v", id.Name(), err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// Keys are id's document keys as `steward worker` loads them: the key
// beside its credentials, certified by their JWT, and a verifier that
// trusts the account that issued them.
func (c *ClosedServer) Keys(t testing.TB, id natsauth.Identity) (*proof.Signer, *proof.Verifier) {
	t.Helper()
	path := c.Creds(t, id)
	s, err := proof.LoadSigner(proof.KeyFileFor(path), path, id.Name())
	if err != nil {
		t.Fatal(err)
	}
	v := proof.NewVerifier()
	if err := v.TrustIssuerOf(path); err != nil {
		t.Fatal(err)
	}
	v.Pin(id.Name(), s.Public())
	return s, v
}

// DocumentKeys is the runtime option of id's document keys (Keys).
func (c *ClosedServer) DocumentKeys(t testing.TB, id natsauth.Identity) workers.Option {
	return workers.WithDocumentKeys(c.Keys(t, id))
}
