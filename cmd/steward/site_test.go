package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/natsauth"
)

// The configuration `steward site config` writes is one nats-server reads:
// the site's domain, its own store, a persistent name, and a link to the
// hub denying Steward's subjects both ways; with --server-dir, the closed
// bus with the link bound to the account.
func TestSiteConfigIsALeafNodeNATSServerReads(t *testing.T) {
	dir := t.TempDir()
	auth, err := natsauth.LoadOrCreate(filepath.Join(dir, "auth"))
	if err != nil {
		t.Fatal(err)
	}
	for name, extra := range map[string][]string{
		"open":   nil,
		"closed": {"--server-dir", filepath.Join(dir, "auth"), "--account", auth.AccountPublic, "--leaf-creds", filepath.Join(dir, "leaf.creds")},
	} {
		t.Run(name, func(t *testing.T) {
			conf := filepath.Join(dir, name+".conf")
			args := append([]string{"site", "config", "site-a", "--hub-url", "nats-leaf://127.0.0.1:7422",
				"--store-dir", filepath.Join(dir, "store-"+name), "--out", conf}, extra...)
			ok(t, nil, args...)
			if err := os.WriteFile(filepath.Join(dir, "leaf.creds"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			o, err := server.ProcessConfigFile(conf)
			if err != nil {
				raw, _ := os.ReadFile(conf)
				t.Fatalf("nats-server refuses the configuration: %v\n%s", err, raw)
			}
			if o.JetStreamDomain != "site-a" || o.ServerName != "steward-site-site-a" || o.StoreDir != filepath.Join(dir, "store-"+name) {
				t.Errorf("domain %q, server name %q, store %q", o.JetStreamDomain, o.ServerName, o.StoreDir)
			}
			if len(o.LeafNode.Remotes) != 1 {
				t.Fatalf("%d remotes, want the hub", len(o.LeafNode.Remotes))
			}
			r := o.LeafNode.Remotes[0]
			if r.URLs[0].String() != "nats-leaf://127.0.0.1:7422" || !r.IgnoreDiscoveredServers {
				t.Errorf("remote %v, ignoring discovered servers %v: want the hub's URL given, and only it", r.URLs, r.IgnoreDiscoveredServers)
			}
			if !slices.Equal(r.DenyImports, events.SiteLinkDenied()) || !slices.Equal(r.DenyExports, events.SiteLinkDenied()) {
				t.Errorf("the link denies imports %v and exports %v, want %v both ways", r.DenyImports, r.DenyExports, events.SiteLinkDenied())
			}
			if name == "closed" {
				if len(o.TrustedOperators) != 1 || r.LocalAccount != auth.AccountPublic || r.Credentials == "" {
					t.Errorf("closed bus: %d operators, link bound to %q with credentials %q", len(o.TrustedOperators), r.LocalAccount, r.Credentials)
				}
			}
			if !o.FeatureFlags["js_api_reply_v2"] {
				t.Errorf("feature flags %v: want js_api_reply_v2, which the leaf identity's permissions rely on", o.FeatureFlags)
			}
		})
	}
}

// `steward creds issue leaf` issues the site's leaf identity from the
// account signing key alone: named for the site, its permissions the
// table's for the site and the hub's domain, with no document key (a leaf
// node signs nothing).
func TestCredsIssueLeafIsTheSitesIdentity(t *testing.T) {
	dir := t.TempDir()
	ok(t, nil, "creds", "init", "--dir", filepath.Join(dir, "auth"))
	out := filepath.Join(dir, "leaf-site-a.creds")
	ok(t, nil, "creds", "issue", "leaf", "site-a", "--hub-domain", "central", "--account-seed", filepath.Join(dir, "auth", natsauth.SigningSeedFile), "--out", out)
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	token, err := jwt.ParseDecoratedJWT(raw)
	if err != nil {
		t.Fatal(err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		t.Fatal(err)
	}
	id, err := natsauth.Leaf("site-a", "central")
	if err != nil {
		t.Fatal(err)
	}
	want := id.Permissions()
	if uc.Name != "leaf-site-a" || !slices.Equal(uc.Pub.Allow, jwt.StringList(want.Publish)) || !slices.Equal(uc.Sub.Allow, jwt.StringList(want.Subscribe)) {
		t.Errorf("leaf credentials: name %q, publish %v, subscribe %v; want leaf-site-a with %+v", uc.Name, uc.Pub.Allow, uc.Sub.Allow, want)
	}
	if !slices.Contains(uc.Pub.Allow, "$JS.central.API.CONSUMER.RESET.STEWARD_EVENTS.site-site-a") {
		t.Errorf("the leaf may not reset its own consumer at the hub's domain: %v", uc.Pub.Allow)
	}
	if _, err := os.Stat(filepath.Join(dir, "leaf-site-a.dockey")); err == nil {
		t.Error("a leaf node got a document key; it signs nothing")
	}
	for _, args := range [][]string{
		{"creds", "issue", "leaf", "site.a", "--account-seed", filepath.Join(dir, "auth", natsauth.SigningSeedFile)},
		{"creds", "issue", "leaf", "hub", "--account-seed", filepath.Join(dir, "auth", natsauth.SigningSeedFile)},
	} {
		if r := run(t, nil, args...); r.code == 0 || !strings.Contains(r.stderr, "leaf identity") {
			t.Errorf("steward %s: exit %d, stderr %q; want a refusal naming the leaf identity", strings.Join(args, " "), r.code, r.stderr)
		}
	}
}

func TestSiteCommandsRefuseBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"site", "config", "site.a", "--hub-url", "nats-leaf://h:7422", "--store-dir", "/tmp/x"}, "site name"},
		{[]string{"site", "config", "site-a", "--hub-url", "http://h", "--store-dir", "/tmp/x"}, "--hub-url"},
		{[]string{"site", "config", "site-a", "--hub-url", "nats-leaf://h:7422"}, "--store-dir"},
		{[]string{"site", "config", "site-a", "--hub-url", "nats-leaf://h:7422", "--store-dir", "/tmp/x", "--server-dir", "/tmp/a", "--account", "AXXX"}, "--leaf-creds"},
		{[]string{"site", "setup", "hub", "--nats-url", "nats://127.0.0.1:1"}, "differ"},
		{[]string{"site", "setup", "site-a", "--hives", "a.b", "--nats-url", "nats://127.0.0.1:1"}, "hive"},
	} {
		r := run(t, nil, tc.args...)
		if r.code == 0 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("steward %s: exit %d, stderr %q; want a refusal naming %s", strings.Join(tc.args, " "), r.code, r.stderr, tc.want)
		}
	}
}
