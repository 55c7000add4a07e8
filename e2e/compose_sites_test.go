package e2e

import (
	"context"
	"crypto/ed25519"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/internal/proof"
	"github.com/steward-dev/steward/internal/signing"
)

// TestComposeSites runs deploy/sites/compose.sites.yaml as local processes
// (a hub and two sites, each a leaf node in its own domain with a
// credential worker in stream read mode at it) and publishes, at the hub,
// a signed rotation for each site's hive: each reaches its site's worker,
// which writes the credential into its site's volume, and its outcome,
// written at the site, reaches the hub.
func TestComposeSites(t *testing.T) {
	p := loadProjectIn(t, filepath.Join(repoRoot, "deploy", "sites"), nil, "deploy/sites/compose.sites.yaml")
	r := newComposeRun(t, p)
	workers := map[string]string{"credential-a": "site-a", "credential-b": "site-b"}
	for name, site := range workers {
		if _, ok := p.Services[name]; !ok {
			t.Fatalf("deploy/sites declares no %s service", name)
		}
		if got := r.declared(name, "STEWARD_JS_DOMAIN"); got != site {
			t.Errorf("%s: STEWARD_JS_DOMAIN=%s; want its site's domain %s", name, got, site)
		}
		if got := r.declared(name, "STEWARD_READ_MODE"); got != "stream" {
			t.Errorf("%s: STEWARD_READ_MODE=%s; want stream", name, got)
		}
		if !strings.Contains(r.declared(name, "STEWARD_NATS_URL"), site+":") {
			t.Errorf("%s connects to %s; want its own site's leaf node", name, r.declared(name, "STEWARD_NATS_URL"))
		}
	}
	for _, name := range slices.Sorted(mapKeys(p.Services)) {
		if isSteward(p.Services[name]) && len(p.Services[name].Entrypoint) == 0 {
			if unknown := r.unknownSettings(name); len(unknown) > 0 {
				t.Errorf("service %s sets %v, which are no flag's twin of `steward %s`", name, unknown, strings.Join(p.Services[name].Command, " "))
			}
		}
	}

	start := time.Now()
	r.start()
	for name := range workers {
		r.waitHealthy(name)
	}
	t.Logf("hub, two sites and their workers up in %v", round(time.Since(start)))

	hub := connect(t, r.mapAddrs("setup", r.declared("setup", "STEWARD_NATS_URL")))
	keys := r.mountPath("keys", "/keys")
	controller, err := signing.LoadPrivateKey(filepath.Join(keys, "controller.key"))
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	published := time.Now()
	for name := range workers {
		hive := r.declared(name, "STEWARD_HIVE")
		data, err := signing.SignRotation(controller, events.CredentialRotated{
			Hive: hive, Version: 1, ClientID: "sites-client-" + hive,
			Secret: encryptTo(t, recipientOf(t, filepath.Join(keys, hive+".pub")), "sites-secret-"+hive),
		})
		if err != nil {
			t.Fatal(err)
		}
		e, err := events.New(events.TypeCredentialRotated, hive, data)
		if err != nil {
			t.Fatal(err)
		}
		e.SetSource("/steward/e2e/compose-sites")
		hub.publish(t, e)
		ids[name] = e.ID()
	}
	for name, site := range workers {
		hive := r.declared(name, "STEWARD_HIVE")
		o := waitOutcome(t, hub, "credential", hive, ids[name], 2*time.Minute)
		if want := "dev.steward.credential.applied.v1"; o.Type() != want {
			t.Errorf("%s: outcome %s (%s) at the hub; want %s", site, o.Type(), o.Data(), want)
		}
		// Signed at the site for its domain, the outcome the hub sourced
		// verifies there as the instance's.
		pub, err := signing.LoadPublicKey(filepath.Join(keys, "credential-"+hive+".pub"))
		if err != nil {
			t.Fatal(err)
		}
		v := proof.NewVerifier()
		v.Pin("credential-"+hive, pub.(ed25519.PublicKey))
		h, err := ops.GetHistory(context.Background(), hub.js, ops.HistoryOptions{Worker: "credential", Key: hive, Proofs: ops.Proofs{Verifier: v}})
		if err != nil {
			t.Fatal(err)
		}
		verified := 0
		for _, en := range h.Entries {
			switch {
			case en.Kind != ops.EntryOutcome:
			case en.Forged != "" || en.Unverified:
				t.Errorf("%s: the hub's history shows the site's outcome forged %q, unverified %v; want it verified in %s's domain", site, en.Forged, en.Unverified, site)
			default:
				verified++
			}
		}
		if verified != 1 {
			t.Errorf("%s: %d outcomes verified in the hub's history; want the site's one", site, verified)
		}
		dir := r.env(p.Services[name])["STEWARD_CREDENTIAL_DIR"]
		if raw, err := os.ReadFile(filepath.Join(dir, "client_id")); err != nil || strings.TrimSpace(string(raw)) != "sites-client-"+hive {
			t.Errorf("%s: the credential volume holds client_id %q (%v); want the rotation's", site, raw, err)
		}
		t.Logf("%s: %s applied at the site, its outcome at the hub %v after the publish", site, hive, round(time.Since(published)))
	}
	r.stop()
	t.Logf("e2e summary: compose sites: 2 sites, 2 rotations published at the hub, 2 applied at their sites, 2 outcomes at the hub, in %v", round(time.Since(published)))
}
