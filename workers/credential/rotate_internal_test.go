package credential

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/agekey"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// The test controller key pair, committed on purpose like hive-1.agekey:
// it signs the made-up rotations of these tests and nothing else.
const (
	testControllerKey = "testdata/controller.key"
	testControllerPub = "testdata/controller.pub"
)

// signedByController is data with the test controller's envelope, as
// `steward publish --signing-key` would send it.
func signedByController(t testing.TB, data events.CredentialRotated) events.CredentialRotated {
	t.Helper()
	key, err := signing.LoadPrivateKey(testControllerKey)
	if err != nil {
		t.Fatal(err)
	}
	signed, err := signing.SignRotation(key, data)
	if err != nil {
		t.Fatal(err)
	}
	return signed
}

// rotationEvent is data, signed by the test controller, as the publisher
// would put it on the bus.
func rotationEvent(t testing.TB, data events.CredentialRotated) event.Event {
	t.Helper()
	data = signedByController(t, data)
	e, err := events.New(events.TypeCredentialRotated, data.Hive, data)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func newTestWorker(t testing.TB) (*Worker, string) {
	t.Helper()
	base := t.TempDir()
	recipient, err := agekey.Generate(filepath.Join(base, "identity.txt"))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "files")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	w, err := New(Config{Hive: "h1", AgeIdentity: filepath.Join(base, "identity.txt"), CredentialDir: dir, ControllerKey: testControllerPub})
	if err != nil {
		t.Fatal(err)
	}
	return w, recipient
}

// handleUnchecked runs Handle on one rotation through a Delivery in memory
// (workertest.Unchecked: the runtime's validation skipped), so data the schema stops
// on the bus (an empty field, another hive) still reaches the handler's own
// checks, and several writers can share one credential folder. It returns
// the handler's error and the outcomes it emitted. Everything the runtime
// would let through goes through workertest.Work instead. data is signed
// by the test controller first, so each case reaches the check it is about.
func handleUnchecked(t testing.TB, w *Worker, data events.CredentialRotated, eventID string) (error, []event.Event) {
	t.Helper()
	return handleAsIs(t, w, signedByController(t, data), eventID)
}

// handleAsIs is handleUnchecked without the signature: data is handled as
// it is given, envelope or none.
func handleAsIs(t testing.TB, w *Worker, data events.CredentialRotated, eventID string) (error, []event.Event) {
	t.Helper()
	raw, err := json.Marshal(data)
	if err != nil {
		t.Fatal(err)
	}
	e := event.New()
	e.SetID(eventID)
	e.SetSource("/test")
	e.SetType(events.TypeCredentialRotated)
	e.SetSubject(data.Hive)
	if err := e.SetData(events.ContentTypeJSON, raw); err != nil {
		t.Fatal(err)
	}
	res := workertest.Work(t, w.Spec(), w, e, workertest.Unchecked())
	return res.Events[0].Err, res.Outcomes
}

func outcomeNames(list []event.Event) []string {
	var out []string
	for _, e := range list {
		out = append(out, workertest.OutcomeName(e))
	}
	return out
}

// openAt opens the credential folder as a rotation does, for a test.
func openAt(t testing.TB, dir string) *folder {
	t.Helper()
	fo, err := openFolder(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fo.close)
	return fo
}

// readAt reads the applied version of dir as a rotation does: open and
// check the folder, then read ..data.
func readAt(dir string) (applied, error) {
	fo, err := openFolder(dir)
	if err != nil {
		return applied{}, err
	}
	defer fo.close()
	return readApplied(fo)
}

func rotation(t testing.TB, recipient string, version uint64, clientID, secret string) events.CredentialRotated {
	t.Helper()
	ct, err := agekey.Encrypt(recipient, []byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	return events.CredentialRotated{Hive: "h1", Version: version, ClientID: clientID, Secret: ct}
}

// state is what a reader can see: where ..data points and the pair.
func state(t *testing.T, dir string) string {
	t.Helper()
	link, _ := os.Readlink(filepath.Join(dir, DataLink))
	c, _ := os.ReadFile(filepath.Join(dir, ClientIDFile))
	s, _ := os.ReadFile(filepath.Join(dir, SecretFile))
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return link + "|" + string(c) + "|" + string(s) + "|" + strings.Join(names, ",")
}

// TestHandlerRefusesEmptyFields covers the handler's own checks on fields
// the schema already refuses on the bus, so the handler does not rely on
// the schema alone.
func TestHandlerRefusesEmptyFields(t *testing.T) {
	w, recipient := newTestWorker(t)
	first := workertest.Work(t, w.Spec(), w, rotationEvent(t, rotation(t, recipient, 1, "client-1", "s3cr3t-1")))
	first.AssertVerdicts(workertest.Applied)
	first.AssertOutcomes(OutcomeApplied)
	before := state(t, w.dir)
	good := rotation(t, recipient, 2, "client-2", "s3cr3t-2")
	cases := map[string]events.CredentialRotated{
		"empty client id":      {Hive: "h1", Version: 2, ClientID: "", Secret: good.Secret},
		"blank client id":      {Hive: "h1", Version: 2, ClientID: " \t", Secret: good.Secret},
		"empty secret":         {Hive: "h1", Version: 2, ClientID: "client-2", Secret: ""},
		"blank secret":         {Hive: "h1", Version: 2, ClientID: "client-2", Secret: "\n "},
		"empty hive":           {Hive: "", Version: 2, ClientID: "client-2", Secret: good.Secret},
		"secret not armored":   {Hive: "h1", Version: 2, ClientID: "client-2", Secret: "s3cr3t-2"},
		"empty plaintext":      rotation(t, recipient, 2, "client-2", ""),
		"another hive's event": {Hive: "h2", Version: 2, ClientID: "client-2", Secret: good.Secret},
	}
	for name, data := range cases {
		err, emitted := handleUnchecked(t, w, data, "ev-"+name)
		if len(emitted) != 1 || workertest.OutcomeName(emitted[0]) != OutcomeRefused || !workers.IsRefused(err) || workers.IsPermanent(err) {
			t.Errorf("%s: outcomes %v, error %v; want one refused outcome and a refusal (workers.Refused, not a dead letter)", name, outcomeNames(emitted), err)
			continue
		}
		ref := workertest.DataAs[Refused](t, emitted[0], events.OutcomeType(Name, OutcomeRefused))
		if ref.Reason == "" || !strings.Contains(err.Error(), "ev-"+name) {
			t.Errorf("%s: the refusal %q (error %q) does not say why or name the event", name, ref.Reason, err)
		}
		if strings.Contains(err.Error(), "s3cr3t") || strings.Contains(ref.Reason, "s3cr3t") {
			t.Errorf("%s: a secret is in the refusal", name)
		}
		if got := state(t, w.dir); got != before {
			t.Fatalf("%s changed the files:\n%s\n%s", name, before, got)
		}
	}
}

func TestReadAppliedNeverTakesAnUnreadableStateForNone(t *testing.T) {
	base := t.TempDir()
	mk := func(name string, setup func(dir string)) string {
		dir := filepath.Join(base, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		setup(dir)
		return dir
	}
	unreadable := map[string]string{
		"directory is a file": func() string {
			p := filepath.Join(base, "file")
			os.WriteFile(p, nil, 0o644)
			return p
		}(),
		"..data is a file": mk("datafile", func(d string) { os.WriteFile(filepath.Join(d, DataLink), []byte("x"), 0o644) }),
		"..data points elsewhere": mk("elsewhere", func(d string) {
			os.Mkdir(filepath.Join(d, "other"), 0o755)
			os.Symlink("other", filepath.Join(d, DataLink))
		}),
		"..data dangles":     mk("dangles", func(d string) { os.Symlink("..v5-abc", filepath.Join(d, DataLink)) }),
		"..data is absolute": mk("absolute", func(d string) { os.Symlink(filepath.Join(d, "..v5-abc"), filepath.Join(d, DataLink)) }),
		"..data leading zero": mk("zero", func(d string) {
			os.Mkdir(filepath.Join(d, "..v05-abc"), 0o755)
			os.Symlink("..v05-abc", filepath.Join(d, DataLink))
		}),
		"..data has no suffix": mk("nosuffix", func(d string) {
			os.Mkdir(filepath.Join(d, "..v5"), 0o755)
			os.Symlink("..v5", filepath.Join(d, DataLink))
		}),
		"..data points to file": mk("tofile", func(d string) {
			os.WriteFile(filepath.Join(d, "..v5-abc"), nil, 0o644)
			os.Symlink("..v5-abc", filepath.Join(d, DataLink))
		}),
	}
	for name, dir := range unreadable {
		if got, err := readAt(dir); err == nil {
			t.Errorf("%s: read as version %d, want an error", name, got.version)
		} else if !strings.Contains(err.Error(), dir) {
			t.Errorf("%s: the error %q does not name the path", name, err)
		}
	}
	empty := mk("empty", func(string) {})
	if got, err := readAt(empty); err != nil || got.version != 0 {
		t.Fatalf("an empty directory: %+v, %v; want version 0", got, err)
	}
	ours := mk("ours", func(d string) {
		os.Mkdir(filepath.Join(d, "..v42-123"), 0o755)
		os.Symlink("..v42-123", filepath.Join(d, DataLink))
	})
	if got, err := readAt(ours); err != nil || got.version != 42 || got.folder != "..v42-123" {
		t.Fatalf("version 42: %+v, %v", got, err)
	}
}

// TestResumeAfterCrash plays the crashes between the steps of a rotation.
func TestResumeAfterCrash(t *testing.T) {
	w, recipient := newTestWorker(t)
	data := rotation(t, recipient, 1, "client-1", "s3cr3t-1")

	// Crash after the swap, before the stable links: the redelivery (with
	// its saved stage) finishes and reports applied.
	fo := openAt(t, w.dir)
	folder, err := writeVersion(fo, 1, "client-1", []byte("s3cr3t-1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := swap(fo, folder); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(w.dir, SecretFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("setup: stable link exists: %v", err)
	}
	fo.close()
	resumed := workertest.Work(t, w.Spec(), w, rotationEvent(t, data), workertest.Redelivered(stage{Folder: folder}))
	resumed.AssertVerdicts(workertest.Applied)
	resumed.AssertOutcomes(OutcomeApplied)
	// Resuming swaps nothing, so it saves no stage of its own.
	resumed.AssertStages()
	if a := workertest.OutcomeAs[Applied](resumed, OutcomeApplied); a.Version != 1 || a.ClientID != "client-1" {
		t.Fatalf("resume applied %+v", a)
	}
	if c, err := os.ReadFile(filepath.Join(w.dir, ClientIDFile)); err != nil || string(c) != "client-1" {
		t.Fatalf("stable client_id after resume: %q %v", c, err)
	}

	// Without a stage (another event of the same version) it is skipped,
	// and missing links are put back all the same.
	os.Remove(filepath.Join(w.dir, SecretFile))
	dup := workertest.Work(t, w.Spec(), w, rotationEvent(t, data))
	dup.AssertVerdicts(workertest.Refused)
	dup.AssertOutcomes(OutcomeSkipped)
	if sk := workertest.OutcomeAs[Skipped](dup, OutcomeSkipped); sk.Applied != 1 || sk.Version != 1 {
		t.Fatalf("duplicate version: skipped %+v, want version 1 below applied 1", sk)
	}
	if s, err := os.ReadFile(filepath.Join(w.dir, SecretFile)); err != nil || string(s) != "s3cr3t-1" {
		t.Fatalf("the secret link was not repaired: %v", err)
	}

	// Crash after writing a folder, before the swap: the orphan is not
	// current and the next rotation removes it.
	fo = openAt(t, w.dir)
	orphan, err := writeVersion(fo, 7, "client-7", []byte("s3cr3t-7"))
	if err != nil {
		t.Fatal(err)
	}
	fo.close()
	after := workertest.Work(t, w.Spec(), w, rotationEvent(t, rotation(t, recipient, 2, "client-2", "s3cr3t-2")))
	after.AssertVerdicts(workertest.Applied)
	after.AssertOutcomes(OutcomeApplied)
	if _, err := os.Stat(filepath.Join(w.dir, orphan)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the orphan %s is still there: %v", orphan, err)
	}

	// The stage cannot be saved: nothing is swapped, no folder is left,
	// and the event is retried.
	before := state(t, w.dir)
	failed := workertest.Work(t, w.Spec(), w, rotationEvent(t, rotation(t, recipient, 3, "client-3", "s3cr3t-3")),
		workertest.SaveStageFails(errors.New("KV is down")))
	failed.AssertVerdicts(workertest.Retried)
	failed.AssertOutcomes()
	failed.AssertStages()
	if got := state(t, w.dir); got != before {
		t.Fatalf("a failed stage changed the files:\n%s\n%s", before, got)
	}
}

func TestParseVersionFolder(t *testing.T) {
	for name, want := range map[string]uint64{"..v1-a": 1, "..v18446744073709551615-x": 1<<64 - 1, "..v12-1234": 12} {
		if got, ok := parseVersionFolder(name); !ok || got != want {
			t.Errorf("%s: %d %v", name, got, ok)
		}
	}
	for _, name := range []string{"", "..v", "..v-1", "..v0-a", "..v1", "..v1-", "..v01-a", "..v+1-a", "..v1-a/b", ".v1-a", "..data", "..v18446744073709551616-a"} {
		if got, ok := parseVersionFolder(name); ok {
			t.Errorf("%q parsed as version %d", name, got)
		}
	}
}

// BenchmarkRotate measures one rotation on disk: decrypt, write and fsync a
// version folder, swap, clean up.
func BenchmarkRotate(b *testing.B) {
	w, recipient := newTestWorker(b)
	data := rotation(b, recipient, 1, "client", "s3cr3t")
	b.ResetTimer()
	for i := range b.N {
		data.Version = uint64(i + 1)
		if err, emitted := handleUnchecked(b, w, data, "ev"); err != nil || len(emitted) != 1 || workertest.OutcomeName(emitted[0]) != OutcomeApplied {
			b.Fatalf("outcomes %v, error %v; want applied", outcomeNames(emitted), err)
		}
	}
}

// TestConcurrentWritersNeverRollBack runs two workers of the same hive on
// one credential directory (two processes sharing the work) and checks the
// applied version never moves backwards: the directory lock keeps one's read
// of the applied version and its swap together.
func TestConcurrentWritersNeverRollBack(t *testing.T) {
	a, recipient := newTestWorker(t)
	b := *a
	ciphertext := rotation(t, recipient, 1, "c", "s3cr3t").Secret
	const top = 120
	done := make(chan struct{})
	var backwards []string
	monitorDone := make(chan struct{})
	go func() {
		defer close(monitorDone)
		var last uint64
		for {
			select {
			case <-done:
				return
			default:
			}
			// As a reader does, without the writers' lock.
			target, err := os.Readlink(filepath.Join(a.dir, DataLink))
			if err != nil {
				continue
			}
			v, _ := parseVersionFolder(target)
			if v < last && len(backwards) < 5 {
				backwards = append(backwards, fmt.Sprintf("version %d after %d", v, last))
			}
			last = max(last, v)
		}
	}()
	errs := make(chan error, 2)
	for i, w := range []*Worker{a, &b} {
		go func() {
			for v := uint64(1 + i); v <= top; v += 2 {
				data := events.CredentialRotated{Hive: "h1", Version: v, ClientID: fmt.Sprintf("client-%d", v), Secret: ciphertext}
				// A version the other writer overtook is refused as stale.
				if err, _ := handleUnchecked(t, w, data, "ev"); err != nil && !workers.IsRefused(err) {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	<-monitorDone
	for _, b := range backwards {
		t.Error(b)
	}
	if c, err := os.ReadFile(filepath.Join(a.dir, ClientIDFile)); err != nil || string(c) != fmt.Sprintf("client-%d", top) {
		t.Fatalf("final client_id %q %v, want client-%d", c, err, top)
	}
}
