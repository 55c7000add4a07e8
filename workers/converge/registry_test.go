package converge

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers/workertest"
)

// fetchWithin runs fetch and fails the test if it has not returned within
// d: the attack these tests make is a read that never ends.
func fetchWithin(t *testing.T, d time.Duration, r registry, version string) (Evidence, error) {
	t.Helper()
	type answer struct {
		e   Evidence
		err error
	}
	done := make(chan answer, 1)
	go func() {
		e, err := r.fetch(context.Background(), version)
		done <- answer{e, err}
	}()
	select {
	case a := <-done:
		return a.e, a.err
	case <-time.After(d):
		t.Fatalf("%s fetch(%s) still blocked after %v", r, version, d)
		return Evidence{}, nil
	}
}

// Issue 12, finding 11: a FIFO (or a device, or a folder) where a release
// file should be is refused at once, whichever of the three files it
// replaces, and the next release still converges: nothing stalls the
// install. On the old code the open of the FIFO blocked for ever.
func TestRegistryRefusesNonRegularFiles(t *testing.T) {
	key := newKeyPair(t, signing.P256)
	reg := t.TempDir()
	for _, c := range []struct {
		version, file, kind string
		make                func(path string) error
	}{
		{"1.1.1", ManifestFile, "named pipe (FIFO)", func(p string) error { return syscall.Mkfifo(p, 0o644) }},
		{"1.1.2", BundleFile, "named pipe (FIFO)", func(p string) error { return syscall.Mkfifo(p, 0o644) }},
		{"1.1.3", SignatureFile, "named pipe (FIFO)", func(p string) error { return syscall.Mkfifo(p, 0o644) }},
		{"1.1.4", ManifestFile, "device", func(p string) error { return os.Symlink("/dev/zero", p) }},
		{"1.1.5", SignatureFile, "directory", func(p string) error { return os.Mkdir(p, 0o755) }},
	} {
		writeRelease(t, reg, key, manifest(c.version, "1.0.0"))
		p := filepath.Join(reg, c.version, c.file)
		if err := os.RemoveAll(p); err != nil {
			t.Fatal(err)
		}
		if err := c.make(p); err != nil {
			t.Fatal(err)
		}
		_, err := fetchWithin(t, 10*time.Second, dirRegistry{root: reg}, c.version)
		var ref *refusal
		if !errors.As(err, &ref) || ref.rule != ruleNotRegular || !strings.Contains(ref.reason, c.file+" in registry "+reg+" is a "+c.kind+", not a regular file") || !strings.Contains(ref.reason, "nothing ran") {
			t.Errorf("%s with %s as a %s: %v, want a %s refusal", c.version, c.file, c.kind, err, ruleNotRegular)
		}
	}

	// End to end: the FIFO release is refused and settled, and the next
	// release converges behind it.
	writeRelease(t, reg, key, manifest("1.2.0", "1.0.0"))
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	_, r := startWorker(t, js, execConfig(t, reg, key, "true"))
	publishRelease(t, js, "1.1.1", "")
	publishRelease(t, js, "1.2.0", "")
	got := waitOutcomes(t, js, 2)
	if ref := outcomeData[Refused](t, got[0], OutcomeRefused); ref.Rule != ruleNotRegular {
		t.Fatalf("refused %+v", ref)
	}
	outcomeData[Succeeded](t, got[1], OutcomeSucceeded)
	noDeadLetters(t, js, r)
}

// An https registry that accepts the connection and never answers, or
// sends its headers and never the body, is given up on within its timeout
// (an error a retry may fix, not a refusal), even with a client that has
// no timeout of its own. On the old code the read waited for ever.
func TestHTTPSRegistryTimesOut(t *testing.T) {
	release := make(chan struct{})
	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if strings.HasSuffix(req.URL.Path, "/1.2.0/"+ManifestFile) {
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("{"))
			w.(http.Flusher).Flush()
		}
		// Held until the test ends, whatever the client does: a handler
		// that returned when its request was cancelled could end the body
		// cleanly, and the client then took "{" as the whole manifest and
		// timed out on the bundle instead (once in about 200 runs).
		<-release
	}))
	t.Cleanup(ts.Close)
	t.Cleanup(func() { close(release) })
	reg, err := newRegistry(ts.URL+"/releases", ts.Client())
	if err != nil {
		t.Fatal(err)
	}
	h := reg.(httpsRegistry)
	h.timeout = 300 * time.Millisecond
	for version, want := range map[string]string{"1.1.0": "did not answer within 300ms", "1.2.0": "did not arrive within 300ms"} {
		_, err := fetchWithin(t, 10*time.Second, h, version)
		var ref *refusal
		if err == nil || errors.As(err, &ref) || !strings.Contains(err.Error(), want) {
			t.Errorf("fetch %s: %v, want a retryable error saying %q", version, err, want)
		}
	}
}

// Issue 12, finding 10: a signed manifest is read as a reviewer reads it.
// A second "opsImage", or an "OpsImage" beside it, is refused rather than
// decoded case-insensitively with the last one winning. On the old code
// each of these ran the evil image.
func TestManifestDecodedStrictly(t *testing.T) {
	key := newKeyPair(t, signing.P256)
	pub := mustKey(t, key)
	head := `{"schema":1,"version":"1.1.0","minFromVersion":"1.0.0","publishedAt":"2026-03-01T12:00:00Z",`
	good, evil := `"`+image("1.1.0")+`"`, `"`+image("evil")+`"`
	for _, c := range []struct{ name, raw, want string }{
		{"case-mismatched key", head + `"opsImage":` + good + `,"OpsImage":` + evil + `}`, `key "OpsImage" in $ is not a field of the document`},
		{"duplicate key", head + `"opsImage":` + good + `,"opsImage":` + evil + `}`, `key "opsImage" appears twice`},
		{"only a case-mismatched key", head + `"OPSIMAGE":` + evil + `}`, `key "OPSIMAGE"`},
		{"case-mismatched version", `{"schema":1,"Version":"1.1.0","minFromVersion":"1.0.0","publishedAt":"2026-03-01T12:00:00Z","opsImage":` + evil + `}`, `key "Version"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			sig, err := signing.SignBlob(key.signer, []byte(c.raw))
			if err != nil {
				t.Fatal(err)
			}
			m, _, err := checkManifest(newReleaseKeys(pub), events.ReleasePublished{Version: "1.1.0"}, "1.0.0", Evidence{Manifest: []byte(c.raw), Signature: []byte(sig)})
			var ref *refusal
			if !errors.As(err, &ref) || ref.rule != ruleManifest || !strings.Contains(ref.reason, c.want) || !strings.Contains(ref.reason, "nothing ran") {
				t.Fatalf("got %v (manifest %+v), want a %s refusal saying %q", err, m, ruleManifest, c.want)
			}
		})
	}
}
