package credential_test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/agekey"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/credential"
	"github.com/steward-dev/steward/workers/replay"
	"github.com/steward-dev/steward/workers/workertest"
)

func randomHex(t testing.TB) string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// versionFolders lists the version folders in the credential directory.
func versionFolders(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "..v") {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestRotationPublishesPairWithModes(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	h := newHive(t, js, "hive-a")
	h.start(h.w.Spec())

	s1 := "s3cr3t-one-" + randomHex(t)
	h.publish(1, "client-one", h.encrypt(s1))
	got := h.waitOutcomes(1)
	a := workertest.DataAs[credential.Applied](t, got[0], typeApplied)
	if a != (credential.Applied{Hive: "hive-a", Version: 1, ClientID: "client-one"}) {
		t.Fatalf("applied outcome %+v", a)
	}
	h.checkPair("client-one", s1)
	if link, err := os.Readlink(filepath.Join(h.cfg.CredentialDir, credential.DataLink)); err != nil || !strings.HasPrefix(link, "..v1-") {
		t.Fatalf("%s -> %q (%v), want a ..v1- folder", credential.DataLink, link, err)
	}

	// Two more rotations: the folder before the previous one is removed.
	s2, s3 := "s3cr3t-two-"+randomHex(t), "s3cr3t-three-"+randomHex(t)
	h.publish(2, "client-two", h.encrypt(s2))
	h.waitOutcomes(2)
	h.checkPair("client-two", s2)
	h.publish(3, "client-three", h.encrypt(s3))
	got = h.waitOutcomes(3)
	h.checkPair("client-three", s3)
	folders := versionFolders(t, h.cfg.CredentialDir)
	if len(folders) != 2 || !strings.HasPrefix(folders[0], "..v2-") || !strings.HasPrefix(folders[1], "..v3-") {
		t.Fatalf("version folders after three rotations: %v, want the ..v2- and ..v3- ones", folders)
	}
	for _, o := range got {
		if o.Type() != typeApplied {
			t.Fatalf("outcome %s, want applied", o.Type())
		}
	}
	if dl := workertest.DeadLetters(h.t, h.js, credential.Name, h.name); len(dl) != 0 {
		t.Fatalf("dead letters: %v", dl[0].Reason)
	}
	if len(h.logLines("info")) == 0 {
		t.Fatal("no log line captured: the leak check would prove nothing")
	}
	h.assertNoSecret()
}

// TestConcurrentReaderSeesMatchedPairs rotates 200 versions through the
// real runtime while readers read the stable paths as fast as they can.
func TestConcurrentReaderSeesMatchedPairs(t *testing.T) {
	const versions = 200
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	h := newHive(t, js, "hive-r")
	dir := h.cfg.CredentialDir
	h.start(h.w.Spec())

	// Each version's pair is recognisable: client-N and secret-N-<random>.
	parse := func(s, prefix string) (int, bool) {
		rest, ok := strings.CutPrefix(s, prefix)
		if !ok {
			return 0, false
		}
		num, _, _ := strings.Cut(rest, "-")
		n, err := strconv.Atoi(num)
		return n, err == nil && n >= 1 && n <= versions
	}

	var (
		wg        sync.WaitGroup
		stop      = make(chan struct{})
		failures  []string
		reads     int // complete reads after the first rotation
		straddled int // client_id then secret crossed a swap
		matched   int // the two client_id reads agreed
		viaData   int // pairs read inside one resolved ..data
		dataGone  int // ..data moved on twice before its folder was read
	)
	// Only the reader goroutine writes these; they are read after wg.Wait.
	fail := func(format string, args ...any) {
		if len(failures) < 10 {
			failures = append(failures, fmt.Sprintf(format, args...))
		}
	}
	// One reader goroutine, so that on a small machine the worker is not
	// starved of CPU; it alternates two ways of reading.
	seenFirst := false
	stablePath := func() {
		// client_id, secret, client_id again, through the stable paths.
		c1, err1 := os.ReadFile(filepath.Join(dir, credential.ClientIDFile))
		s, err2 := os.ReadFile(filepath.Join(dir, credential.SecretFile))
		c2, err3 := os.ReadFile(filepath.Join(dir, credential.ClientIDFile))
		if err1 != nil && !seenFirst && isNotExist(err1) {
			return
		}
		seenFirst = true
		if err1 != nil || err2 != nil || err3 != nil {
			fail("a file is missing after the first rotation: %v / %v / %v", err1, err2, err3)
			return
		}
		n1, ok1 := parse(string(c1), "client-")
		ns, ok2 := parse(string(s), "secret-")
		n2, ok3 := parse(string(c2), "client-")
		if !ok1 || !ok2 || !ok3 {
			fail("unrecognisable content: client_id %q, secret of %d bytes, client_id %q", c1, len(s), c2)
			return
		}
		// Versions only move forward, so the secret read between two
		// client ids belongs to a version between them; when they agree it
		// is theirs.
		if ns < n1 || ns > n2 {
			fail("secret of version %d read between client ids %d and %d", ns, n1, n2)
		}
		reads++
		if ns != n1 {
			straddled++
		}
		if n1 == n2 {
			matched++
		}
	}
	viaDataLink := func() {
		// Resolve ..data once and read both files inside that folder.
		folder, err := os.Readlink(filepath.Join(dir, credential.DataLink))
		if err != nil {
			return
		}
		c, err1 := os.ReadFile(filepath.Join(dir, folder, credential.ClientIDFile))
		s, err2 := os.ReadFile(filepath.Join(dir, folder, credential.SecretFile))
		if isNotExist(err1) || isNotExist(err2) {
			dataGone++
			return
		}
		if err1 != nil || err2 != nil {
			fail("read %s: %v / %v", folder, err1, err2)
			return
		}
		nc, ok1 := parse(string(c), "client-")
		ns, ok2 := parse(string(s), "secret-")
		if !ok1 || !ok2 || nc != ns {
			fail("%s holds client_id %q with the secret of another version (%d)", folder, c, ns)
		}
		viaData++
	}
	// The reader says when it has made one matched read each way, so the
	// test stops it only then: on a loaded machine it may get little time
	// while the rotations run, and after the last one the pair holds still.
	readBoth := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		signalled := false
		for {
			select {
			case <-stop:
				return
			default:
			}
			stablePath()
			viaDataLink()
			if matched > 0 && viaData > 0 && !signalled {
				close(readBoth)
				signalled = true
			}
			// Let the worker's goroutines run on a machine with few cores.
			runtime.Gosched()
		}
	}()

	start := time.Now()
	for v := 1; v <= versions; v++ {
		h.publish(uint64(v), fmt.Sprintf("client-%d", v), h.encrypt(fmt.Sprintf("secret-%d-%s", v, randomHex(t))))
	}
	// Wait in steps, each with the full timeout, so a slow shared machine
	// is not mistaken for a stuck worker.
	for step := 50; step <= versions; step += 50 {
		workertest.WaitUntil(t, fmt.Sprintf("version %d is applied", step), func() bool {
			c, err := os.ReadFile(filepath.Join(dir, credential.ClientIDFile))
			n, ok := parse(string(c), "client-")
			return err == nil && ok && n >= step
		})
	}
	elapsed := time.Since(start)
	select {
	case <-readBoth:
	case <-time.After(30 * time.Second):
		t.Error("the readers made no matched read each way within 30s of the last rotation")
	}
	close(stop)
	wg.Wait()

	for _, f := range failures {
		t.Error(f)
	}
	if reads == 0 || matched == 0 || viaData == 0 {
		t.Fatalf("the readers read nothing useful (%d reads, %d matched, %d via ..data)", reads, matched, viaData)
	}
	t.Logf("%d rotations in %v (%.0f/s); stable-path reader: %d reads, %d matched, %d straddled a swap; ..data reader: %d pairs, %d found their folder gone",
		versions, elapsed, versions/elapsed.Seconds(), reads, matched, straddled, viaData, dataGone)

	// Latest wins: a rotation still queued when a newer one arrives is
	// superseded, never applied after it; the applied ones rise, and the
	// last version is applied.
	got := h.waitOutcomes(versions)
	var last uint64
	applied := 0
	for i, o := range got {
		if o.Type() == "dev.steward.credential."+events.OutcomeSuperseded+".v1" {
			continue
		}
		a := workertest.DataAs[credential.Applied](t, o, typeApplied)
		if a.Version <= last {
			t.Fatalf("outcome %d applied version %d after version %d", i, a.Version, last)
		}
		last = a.Version
		applied++
	}
	if last != versions {
		t.Fatalf("the last version applied is %d, want %d", last, versions)
	}
	t.Logf("%d rotations applied, %d superseded", applied, versions-applied)
	if n := len(versionFolders(t, dir)); n > 2 {
		t.Fatalf("%d version folders left, want at most the current and the previous", n)
	}
	h.assertNoSecret()
}

// TestRefusalsLeaveFilesInPlace sends what a mistaken operator or an
// attacker would, after a good pair is in place, and checks each leaves the
// files byte for byte as they were.
func TestRefusalsLeaveFilesInPlace(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	h := newHive(t, js, "hive-x")
	h.start(h.w.Spec())
	subject := events.EventsPrefix + ".credential.rotated." + h.name

	good := "s3cr3t-good-" + randomHex(t)
	h.publish(1, "client-one", h.encrypt("s3cr3t-first-"+randomHex(t)))
	h.publish(3, "client-three", h.encrypt(good))
	h.waitOutcomes(2)
	h.checkPair("client-three", good)
	before := snapshot(t, h.cfg.CredentialDir)

	other := filepath.Join(t.TempDir(), "other.txt")
	otherRecipient, err := agekey.Generate(other)
	if err != nil {
		t.Fatal(err)
	}
	otherSecret := "s3cr3t-other-" + randomHex(t)
	h.secrets = append(h.secrets, []byte(otherSecret))
	toOther, err := agekey.Encrypt(otherRecipient, []byte(otherSecret))
	if err != nil {
		t.Fatal(err)
	}
	corrupted := h.encrypt("s3cr3t-corrupt-" + randomHex(t))
	lines := strings.Split(corrupted, "\n")
	body := []byte(lines[1])
	body[20] ^= 'A' ^ 'B'
	if body[20] == lines[1][20] {
		t.Fatal("corruption did not change the ciphertext")
	}
	lines[1] = string(body)
	corrupted = strings.Join(lines, "\n")
	truncated := h.encrypt("s3cr3t-truncated-" + randomHex(t))
	truncated = truncated[:strings.Index(truncated, "-----END")]
	lastBody := h.encrypt("s3cr3t-short-" + randomHex(t))
	short := strings.Split(lastBody, "\n")
	shortened := strings.Join(append(short[:len(short)-3], short[len(short)-2:]...), "\n")

	refusals := []struct {
		name, clientID, secret, reason string
		version                        uint64
	}{
		{"wrong recipient", "client-four", toOther, "not encrypted to this hive's identity", 4},
		{"corrupted ciphertext", "client-four", corrupted, "cannot be opened", 4},
		{"truncated ciphertext", "client-four", truncated, "cannot be opened", 4},
		{"ciphertext missing a line", "client-four", shortened, "cannot be opened", 4},
		{"not age at all", "client-four", "-----BEGIN AGE ENCRYPTED FILE-----\nbm90IGFnZQ==\n-----END AGE ENCRYPTED FILE-----\n", "cannot be opened", 4},
		{"empty secret", "client-four", h.encrypt(""), "is empty once decrypted", 4},
		{"whitespace secret", "client-four", h.encrypt(" \n\t\n"), "is empty once decrypted", 4},
	}
	outcomes, dead := 2, 0
	for _, r := range refusals {
		attempts := h.attempts.Load()
		h.publish(r.version, r.clientID, r.secret)
		outcomes++
		got := h.waitOutcomes(outcomes)
		ref := workertest.DataAs[credential.Refused](t, got[outcomes-1], typeRefused)
		if ref.Hive != h.name || ref.Version != r.version || !strings.Contains(ref.Reason, r.reason) || !strings.Contains(ref.Reason, "left as they were (version 3)") {
			t.Errorf("%s: refused outcome %+v, want a reason with %q naming version 3 kept", r.name, ref, r.reason)
		}
		// A refusal is settled with its outcome: one delivery, no dead
		// letter, and the runtime's line names the reason.
		workertest.WaitIdle(t, js, h.consumer())
		if n := h.attempts.Load() - attempts; n != 1 {
			t.Errorf("%s: %d deliveries, want 1 (a refusal is not retried)", r.name, n)
		}
		if dl := workertest.DeadLetters(h.t, h.js, credential.Name, h.name); len(dl) != 0 {
			t.Errorf("%s: a refusal was dead-lettered: %s", r.name, dl[0].Reason)
		}
		if !h.logged("event refused by the worker's rules", r.reason) {
			t.Errorf("%s: no log line says the event was refused with %q", r.name, r.reason)
		}
		sameSnapshot(t, r.name, before, snapshot(t, h.cfg.CredentialDir))
	}
	wrong := workertest.Outcomes(h.t, h.js, credential.Name, h.name)[2]
	if ref := workertest.DataAs[credential.Refused](t, wrong, typeRefused); !strings.Contains(ref.Reason, h.recipient) {
		t.Errorf("the wrong-recipient refusal does not name the recipient to encrypt to: %s", ref.Reason)
	}

	// Stale versions are refused as stale: reported skipped, settled,
	// never a dead letter.
	for _, v := range []uint64{2, 3} {
		h.publish(v, "client-stale", h.encrypt("s3cr3t-stale-"+randomHex(t)))
		outcomes++
		got := h.waitOutcomes(outcomes)
		sk := workertest.DataAs[credential.Skipped](t, got[outcomes-1], typeSkipped)
		if sk != (credential.Skipped{Hive: h.name, Version: v, Applied: 3}) {
			t.Errorf("stale version %d: outcome %+v", v, sk)
		}
		sameSnapshot(t, fmt.Sprintf("stale version %d", v), before, snapshot(t, h.cfg.CredentialDir))
	}
	workertest.WaitIdle(t, js, h.consumer())
	if dl := workertest.DeadLetters(h.t, h.js, credential.Name, h.name); len(dl) != 0 {
		t.Fatalf("a stale version was dead-lettered: %s", dl[0].Reason)
	}

	// What the schema or the runtime refuses never reaches the handler: a
	// dead letter names the field, and no outcome is emitted.
	cipher := h.encrypt("s3cr3t-raw-" + randomHex(t))
	raw := func(fields map[string]any) []byte {
		b, err := json.Marshal(fields)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	attempts := h.attempts.Load()
	invalid := []struct {
		name, subject, key string
		data               []byte
		reason             string
	}{
		{"empty client id", subject, h.name, raw(map[string]any{"hive": h.name, "version": 4, "clientId": "", "secret": cipher}), "/clientId"},
		{"empty secret", subject, h.name, raw(map[string]any{"hive": h.name, "version": 4, "clientId": "c", "secret": ""}), "/secret"},
		{"client id with a newline", subject, h.name, raw(map[string]any{"hive": h.name, "version": 4, "clientId": "a\nb", "secret": cipher}), "/clientId"},
		{"version zero", subject, h.name, raw(map[string]any{"hive": h.name, "version": 0, "clientId": "c", "secret": cipher}), "/version"},
		{"negative version", subject, h.name, raw(map[string]any{"hive": h.name, "version": -1, "clientId": "c", "secret": cipher}), "/version"},
		{"plaintext secret", subject, h.name, raw(map[string]any{"hive": h.name, "version": 4, "clientId": "c", "secret": "hunter2"}), "/secret"},
		{"extra field", subject, h.name, raw(map[string]any{"hive": h.name, "version": 4, "clientId": "c", "secret": cipher, "path": "/etc/shadow"}), "path"},
		{"path in hive", subject, h.name, raw(map[string]any{"hive": "../etc", "version": 4, "clientId": "c", "secret": cipher}), "/hive"},
		{"another hive's data on this subject", subject, "hive-y", raw(map[string]any{"hive": "hive-y", "version": 4, "clientId": "c", "secret": cipher}), "does not end in the event's key"},
		{"subject and data disagree", subject, h.name, raw(map[string]any{"hive": "hive-y", "version": 4, "clientId": "c", "secret": cipher}), "must equal the data's hive"},
	}
	for _, c := range invalid {
		publishRaw(t, js, c.subject, c.key, c.data)
		dead++
		dl := h.waitDeadLetters(dead)
		if last := dl[dead-1]; !strings.Contains(last.Reason, c.reason) {
			t.Errorf("%s: dead letter reason %q does not name %q", c.name, last.Reason, c.reason)
		}
		sameSnapshot(t, c.name, before, snapshot(t, h.cfg.CredentialDir))
	}
	if got := h.attempts.Load(); got != attempts {
		t.Errorf("the handler ran %d times for events the runtime must refuse", got-attempts)
	}
	if n := len(workertest.Outcomes(h.t, h.js, credential.Name, h.name)); n != outcomes {
		t.Errorf("%d outcomes, want %d: invalid events must not reach the handler", n, outcomes)
	}

	// Another hive's event on its own subject never reaches this worker:
	// the stale marker after it is the only delivery.
	attempts = h.attempts.Load()
	workertest.PublishData(t, js, events.TypeCredentialRotated, "hive-y", events.CredentialRotated{Hive: "hive-y", Version: 9, ClientID: "c", Secret: cipher})
	h.publish(1, "client-marker", cipher)
	outcomes++
	h.waitOutcomes(outcomes)
	if got := h.attempts.Load() - attempts; got != 1 {
		t.Errorf("%d deliveries for one marker and one event of another hive, want 1", got)
	}
	h.checkPair("client-three", good)
	sameSnapshot(t, "another hive", before, snapshot(t, h.cfg.CredentialDir))
	h.assertNoSecret()
}

// TestAnotherHiveIsRefusedByTheHandler runs the handler behind a consumer
// that sees every hive, so an event for another hive reaches it.
func TestAnotherHiveIsRefusedByTheHandler(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	h := newHive(t, js, "hive-a")
	spec := h.w.Spec()
	spec.Instance = "wide"
	spec.Subjects = []string{events.EventsPrefix + ".credential.rotated.*"}
	r := h.start(spec)

	good := "s3cr3t-a-" + randomHex(t)
	h.publish(1, "client-a", h.encrypt(good))
	workertest.PublishData(t, js, events.TypeCredentialRotated, "hive-b", signed(t, events.CredentialRotated{Hive: "hive-b", Version: 2, ClientID: "client-b", Secret: h.encrypt("s3cr3t-b-" + randomHex(t))}))
	workertest.WaitIdle(t, js, r.ConsumerName())

	got := workertest.Outcomes(t, js, credential.Name, "wide")
	if len(got) != 2 {
		t.Fatalf("%d outcomes, want 2", len(got))
	}
	// Different hives are different keys, handled in parallel.
	if got[0].Type() != typeApplied {
		got[0], got[1] = got[1], got[0]
	}
	workertest.DataAs[credential.Applied](t, got[0], typeApplied)
	ref := workertest.DataAs[credential.Refused](t, got[1], typeRefused)
	if ref.Hive != "hive-b" || !strings.Contains(ref.Reason, `this worker serves hive "hive-a"`) {
		t.Fatalf("refusal %+v", ref)
	}
	if dl := workertest.DeadLetters(t, js, credential.Name, "wide"); len(dl) != 0 {
		t.Fatalf("the refusal was dead-lettered: %+v", dl)
	}
	if !h.logged("event refused by the worker's rules", `is for hive \"hive-b\"`) {
		t.Fatal("no log line says the other hive's event was refused")
	}
	h.checkPair("client-a", good)
	for _, l := range strings.Split(h.logs.String(), "\n") {
		if strings.Contains(l, "s3cr3t-") {
			t.Fatalf("a secret is in the log: %.80s", l)
		}
	}
}

// TestRetryableFailuresAreRetriedThenApplied makes the write fail in ways an
// operator fixes (the directory is a file, or holds something the worker
// will not remove) and checks the event is retried loudly, then applied,
// with no placeholder ever written; once the file is gone, the worker makes
// the missing folder itself (issue 14).
func TestRetryableFailuresAreRetriedThenApplied(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	h := newHive(t, js, "hive-f")
	dir := h.cfg.CredentialDir

	// The credential directory is a regular file at first (tests run as
	// root, so a read-only mode would not stop the write).
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, []byte("not a folder"), 0o644); err != nil {
		t.Fatal(err)
	}
	parent := snapshot(t, filepath.Dir(dir))
	h.start(h.w.Spec())
	s1 := "s3cr3t-f1-" + randomHex(t)
	h.publish(1, "client-one", h.encrypt(s1))
	workertest.WaitUntil(t, "three failed deliveries", func() bool { return h.attempts.Load() >= 3 })
	sameSnapshot(t, "while the directory is a file", parent, snapshot(t, filepath.Dir(dir)))
	if len(workertest.Outcomes(h.t, h.js, credential.Name, h.name)) != 0 || len(workertest.DeadLetters(h.t, h.js, credential.Name, h.name)) != 0 {
		t.Fatal("a retryable failure produced an outcome or a dead letter")
	}
	loud := h.logLines("error")
	if len(loud) < 3 || !strings.Contains(loud[0], dir) || !strings.Contains(loud[0], "is not a folder") {
		t.Fatalf("want an error line per failed delivery naming the state found, got %d: %v", len(loud), loud)
	}

	// Then the file is removed: the folder is missing, which is the
	// worker's to create.
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	got := h.waitOutcomes(1)
	workertest.DataAs[credential.Applied](t, got[0], typeApplied)
	h.checkPair("client-one", s1)
	if fi, err := os.Lstat(dir); err != nil || fi.Mode() != fs.ModeDir|0o755 {
		t.Fatalf("the folder the worker made: %v, %v; want drwxr-xr-x", fi.Mode(), err)
	}

	// A leftover the worker will not remove blocks the swap: the old pair
	// stays readable while version 2 is retried.
	obstacle := filepath.Join(dir, "..data_tmp")
	if err := os.MkdirAll(filepath.Join(obstacle, "keep"), 0o755); err != nil {
		t.Fatal(err)
	}
	n := h.attempts.Load()
	s2 := "s3cr3t-f2-" + randomHex(t)
	h.publish(2, "client-two", h.encrypt(s2))
	workertest.WaitUntil(t, "three failed swaps", func() bool { return h.attempts.Load() >= n+3 })
	h.checkPair("client-one", s1)
	if !strings.Contains(h.logs.String(), obstacle+" is in the way of the swap") {
		t.Fatal("no error line names the leftover in the way")
	}
	// Moved out of the way in one step, then removed: removed in place,
	// it is emptied first, and the worker, retrying meanwhile, may take
	// the empty folder away and put its own link there before the folder
	// itself goes (RemoveAll then fails on the link, as CI met once).
	gone := filepath.Join(t.TempDir(), "gone")
	if err := os.Rename(obstacle, gone); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(gone); err != nil {
		t.Fatal(err)
	}
	got = h.waitOutcomes(2)
	workertest.DataAs[credential.Applied](t, got[1], typeApplied)
	h.checkPair("client-two", s2)
	if folders := versionFolders(t, dir); len(folders) != 2 {
		t.Fatalf("failed attempts left version folders behind: %v", folders)
	}
	if dl := workertest.DeadLetters(h.t, h.js, credential.Name, h.name); len(dl) != 0 {
		t.Fatalf("dead letter: %s", dl[0].Reason)
	}
	h.assertNoSecret()
}

// TestReplayChangesNothing replays the stream through the handler outside
// the consumer, where no checkpoint protects the files: the version the
// files hold does, so nothing is rewritten.
func TestReplayChangesNothing(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	h := newHive(t, js, "hive-p")
	r := h.start(h.w.Spec())
	s2 := "s3cr3t-p2-" + randomHex(t)
	h.publish(1, "client-one", h.encrypt("s3cr3t-p1-"+randomHex(t)))
	h.publish(2, "client-two", h.encrypt(s2))
	h.waitOutcomes(2)
	before := snapshot(t, h.cfg.CredentialDir)

	var results []replay.Result
	err := r.Replayer(t).Replay(t.Context(), replay.From{}, false, nil, func(res replay.Result) { results = append(results, res) })
	if err != nil {
		t.Fatal(err)
	}
	// Both versions are in place already, so both are refused as stale.
	if len(results) != 2 || !workers.IsRefused(results[0].Err) || !workers.IsRefused(results[1].Err) {
		t.Fatalf("replay results %+v", results)
	}
	sameSnapshot(t, "replay", before, snapshot(t, h.cfg.CredentialDir))
	h.checkPair("client-two", s2)
}
