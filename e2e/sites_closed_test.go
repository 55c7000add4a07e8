package e2e

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/natsauth"
	"github.com/steward-dev/steward/internal/proof"
	"github.com/steward-dev/steward/workers"
)

// closedSites is the closed bus of the sites test: the authority `steward
// creds init` made, the server files the hub and every leaf node trust,
// and the operator's credentials. A nil *closedSites is the open bus.
type closedSites struct {
	auth                             *natsauth.Authority
	dir, authDir, serverDir, opCreds string
}

func newClosedSites(t *testing.T) *closedSites {
	t.Helper()
	dir := t.TempDir()
	c := &closedSites{dir: dir, authDir: filepath.Join(dir, "auth"), serverDir: filepath.Join(dir, "server"), opCreds: filepath.Join(dir, "operator.creds")}
	runSteward(t, nil, "creds", "init", "--dir", c.authDir, "--server-dir", c.serverDir)
	auth, err := natsauth.LoadOrCreate(c.authDir)
	if err != nil {
		t.Fatal(err)
	}
	c.auth = auth
	runSteward(t, nil, "creds", "issue", "operator", "--account-seed", c.seed(), "--out", c.opCreds)
	return c
}

func (c *closedSites) seed() string { return filepath.Join(c.authDir, natsauth.SigningSeedFile) }

// summaryName names the test's summary line.
func (c *closedSites) summaryName() string {
	if c == nil {
		return "sites-cut"
	}
	return "sites-cut-closed"
}

func (c *closedSites) name() string {
	if c == nil {
		return "open"
	}
	return "closed"
}

// hubConf is what the hub's configuration adds: the feature flag the leaf
// identity's permissions rely on (harmless on the open bus, where site
// config writes it for the leaf nodes too), and on the closed bus the
// operator and the accounts it trusts.
func (c *closedSites) hubConf() string {
	flags := "feature_flags: {\n  js_api_reply_v2: true\n}\n"
	if c == nil {
		return flags
	}
	return flags + fmt.Sprintf("operator: %q\nresolver: {\n  type: full\n  dir: %q\n}\n",
		filepath.Join(c.serverDir, natsauth.OperatorJWTFile), filepath.Join(c.serverDir, natsauth.ResolverDir))
}

// leafArgs are `steward site config`'s flags for site's leaf node on the
// closed bus: the server files, the account, and the site's own leaf
// identity, issued as an operator issues it.
func (c *closedSites) leafArgs(t *testing.T, site string) []string {
	t.Helper()
	if c == nil {
		return nil
	}
	creds := filepath.Join(c.dir, "leaf-"+site+".creds")
	runSteward(t, nil, "creds", "issue", "leaf", site, "--account-seed", c.seed(), "--out", creds)
	return []string{"--server-dir", c.serverDir, "--account", c.auth.AccountPublic, "--leaf-creds", creds}
}

// operatorEnv is the environment of a steward command run as the operator.
func (c *closedSites) operatorEnv() map[string]string {
	if c == nil {
		return nil
	}
	return map[string]string{"STEWARD_NATS_CREDS": c.opCreds}
}

// connect connects the test's own client, the operator on the closed bus.
func (c *closedSites) connect(t *testing.T, url string) *bus {
	t.Helper()
	if c == nil {
		return connect(t, url)
	}
	return connectAs(t, url, c.opCreds)
}

// instance is a worker instance's own connection to its site's leaf node
// and its document keys, as `steward worker` has them on the closed bus;
// nil on the open bus, where the instances share connections.
func (c *closedSites) instance(t *testing.T, leafURL, site, worker, key string) (jetstream.JetStream, []workers.Option) {
	t.Helper()
	if c == nil {
		return nil, nil
	}
	id, err := natsauth.Worker(worker, key)
	if err != nil {
		t.Fatal(err)
	}
	creds := filepath.Join(c.dir, id.Name()+".creds")
	if err := c.auth.WriteCreds(creds, id); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(leafURL, nats.UserCredentials(creds), nats.CustomInboxPrefix(id.InboxPrefix()),
		nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := events.JetStreamIn(nc, site)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := proof.LoadSigner(proof.KeyFileFor(creds), creds, id.Name())
	if err != nil {
		t.Fatal(err)
	}
	v := proof.NewVerifier()
	if err := v.TrustIssuerOf(creds); err != nil {
		t.Fatal(err)
	}
	v.Pin(id.Name(), signer.Public())
	return js, []workers.Option{workers.WithDocumentKeys(signer, v)}
}
