package converge

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/signing"
)

// TestDevStateOf: dev's banner takes the installed version only from a
// document that verified, says where it comes from, and says why one
// present was not believed; a first start is only a missing document.
func TestDevStateOf(t *testing.T) {
	key := events.StateKey(Name, DevInstall, InstalledDoc)
	doc := func(v Installed, trusted bool, forgery *events.Forgery) events.Doc {
		raw, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		d := events.Doc{Key: key, Info: events.InfoOf(key), Revision: 3, Trusted: trusted, Forgery: forgery}
		if trusted {
			d.Value = raw
		}
		return d
	}
	at := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name    string
		doc     events.Doc
		version string
		said    []string
	}{
		{"missing", events.Doc{Key: key, Info: events.InfoOf(key)}, DevInstalledVersion, []string{"first start"}},
		{"recorded", doc(Installed{Version: "1.2.0", EventID: "rel-1.2.0", UpdatedAt: at, Evidence: &Evidence{}}, true, nil), "1.2.0",
			[]string{"recorded in " + key, "signed by converge-dev", "event rel-1.2.0", "2026-03-01T10:00:00Z"}},
		{"seed", doc(Installed{Version: "1.0.0", Seed: true, UpdatedAt: at}, true, nil), "1.0.0", []string{"seed", "no release converged yet"}},
		{"no evidence", doc(Installed{Version: "1.3.0", UpdatedAt: at}, true, nil), "1.3.0", []string{"without the signed evidence", "rebuilds it"}},
		{"foreign seed", doc(Installed{Version: "1.3.0", Seed: true, UpdatedAt: at}, true, nil), "1.3.0", []string{"without the signed evidence", "rebuilds it"}},
		{"forged", doc(Installed{Version: "9.0.0"}, false, &events.Forgery{Reason: "signed by publisher"}), DevInstalledVersion,
			[]string{"not believed", "signed by publisher", "rebuilds it"}},
	} {
		st := DevStateOf(c.doc)
		if st.Version != c.version {
			t.Errorf("%s: version %q, want %q", c.name, st.Version, c.version)
		}
		for _, w := range c.said {
			if !strings.Contains(st.Said, w) {
				t.Errorf("%s: %q does not say %q", c.name, st.Said, w)
			}
		}
		if c.name != "missing" && strings.Contains(st.Said, "first start") {
			t.Errorf("%s: %q reads as a first start", c.name, st.Said)
		}
	}
}

// TestDevFromState: a development install at 1.2.0 gets the releases
// above it signed in its registry, verifying with its key, and lines that
// say 1.2.0 and converge to 1.3.0 then 1.4.0, never below.
func TestDevFromState(t *testing.T) {
	dir := t.TempDir()
	st := DevState{Version: "1.2.0", Said: "recorded"}
	if got, want := st.Next(), []string{"1.3.0", "1.4.0", "1.5.0", "1.6.0", "1.7.0", "1.8.0"}; !slices.Equal(got, want) {
		t.Fatalf("next %v, want %v", got, want)
	}
	_, lines, err := DevFrom(context.Background(), dir, st)
	if err != nil {
		t.Fatal(err)
	}
	key, err := signing.LoadPublicKey(filepath.Join(dir, "keys", "cosign.pub"))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range st.Next() {
		evd, err := (dirRegistry{root: filepath.Join(dir, "registry")}).fetch(context.Background(), v)
		if err != nil {
			t.Fatalf("release %s: %v", v, err)
		}
		m, _, err := verifyEvidence(newReleaseKeys(key), v, evd)
		if err != nil {
			t.Fatalf("release %s does not verify: %v", v, err)
		}
		if m.MinFromVersion != DevInstalledVersion {
			t.Fatalf("release %s installs from %s, want %s", v, m.MinFromVersion, DevInstalledVersion)
		}
	}
	joined := strings.Join(lines, "\n")
	for _, w := range []string{`install "dev" at 1.2.0 (recorded)`, `converge to 1.3.0:`, `{"version":"1.3.0"}`, `then to 1.4.0:`, "signed releases 1.3.0 to 1.8.0"} {
		if !strings.Contains(joined, w) {
			t.Fatalf("lines do not say %q:\n%s", w, joined)
		}
	}
	if strings.Contains(joined, `"1.1.0"`) || strings.Contains(joined, `"1.2.0"`) {
		t.Fatalf("lines publish a version at or below the installed 1.2.0:\n%s", joined)
	}
}
