package credential_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/steward-dev/steward/workers/credential"
	"github.com/steward-dev/steward/workers/workertest"
)

// foreignUID stands for another local user: the tests run as root, so a
// foreign owner is made with Lchown.
const foreignUID = 65534

// waitFailures waits until n more deliveries than before have failed and
// been logged, and returns the error lines logged meanwhile. It waits on
// the lines themselves: the runtime logs a failure after the handler has
// returned, so a count of handler calls runs ahead of them.
func (h *hive) waitFailures(n int, what string) []string {
	h.t.Helper()
	before := len(h.logLines("error"))
	workertest.WaitUntil(h.t, what, func() bool { return len(h.logLines("error")) >= before+n })
	return h.logLines("error")[before:]
}

// TestMissingFolderIsMadeByTheWorker is issue 14: with --credential-dir
// naming a folder that does not exist yet (nor its parents), the worker
// starts and the first rotation makes it, 0755, as install -d does. A
// folder that cannot be made (a file where a parent should be) is loud and
// retried until it can.
func TestMissingFolderIsMadeByTheWorker(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	var blocker string
	h := newHiveWith(t, js, "hive-m", func(cfg *credential.Config) {
		blocker = filepath.Join(filepath.Dir(cfg.CredentialDir), "run")
		cfg.CredentialDir = filepath.Join(blocker, "hive", "files")
		if err := os.WriteFile(blocker, []byte("in the way"), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	dir := h.cfg.CredentialDir
	h.start(h.w.Spec())
	s1 := "s3cr3t-m1-" + randomHex(t)
	h.publish(1, "client-one", h.encrypt(s1))
	loud := h.waitFailures(3, "three deliveries fail while a file is in the way")
	if len(loud) < 3 || !strings.Contains(loud[0], "the parent "+blocker+" of the credential folder is not a folder") || !strings.Contains(loud[0], "the worker retries") {
		t.Fatalf("want an error line per delivery naming the file in the way, got %d: %v", len(loud), loud)
	}
	if len(workertest.Outcomes(h.t, h.js, credential.Name, h.name)) != 0 || len(workertest.DeadLetters(h.t, h.js, credential.Name, h.name)) != 0 {
		t.Fatal("a folder that cannot be made produced an outcome or a dead letter")
	}

	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	got := h.waitOutcomes(1)
	workertest.DataAs[credential.Applied](t, got[0], typeApplied)
	h.checkPair("client-one", s1)
	for _, p := range []string{blocker, filepath.Dir(dir), dir} {
		fi, err := os.Lstat(p)
		if err != nil || fi.Mode() != fs.ModeDir|0o755 {
			t.Fatalf("%s: %v %v, want a folder made 0755", p, fi.Mode(), err)
		}
		if !h.logged("credential folder created", p) {
			t.Errorf("no log line says %s was created", p)
		}
	}
	h.assertNoSecret()
}

// TestLinkInTheFolderPlaceIsNotFollowed: a symbolic link where the
// credential folder should be is refused loudly and retried, and nothing
// is written where it points; a real folder in its place is then used.
func TestLinkInTheFolderPlaceIsNotFollowed(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	elsewhere := t.TempDir()
	h := newHiveWith(t, js, "hive-l", func(cfg *credential.Config) {
		if err := os.Symlink(elsewhere, cfg.CredentialDir); err != nil {
			t.Fatal(err)
		}
	})
	dir := h.cfg.CredentialDir
	h.start(h.w.Spec())
	s1 := "s3cr3t-l1-" + randomHex(t)
	h.publish(1, "client-one", h.encrypt(s1))
	loud := h.waitFailures(3, "three deliveries refuse the link")
	if len(loud) < 3 || !strings.Contains(loud[0], "the credential folder "+dir+" is a symbolic link") || !strings.Contains(loud[0], elsewhere) {
		t.Fatalf("want an error line per delivery naming the link and its target, got %d: %v", len(loud), loud)
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
		t.Fatalf("the worker wrote through the link: %v", entries)
	}
	if len(workertest.Outcomes(h.t, h.js, credential.Name, h.name)) != 0 || len(workertest.DeadLetters(h.t, h.js, credential.Name, h.name)) != 0 {
		t.Fatal("the link produced an outcome or a dead letter")
	}
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	// A redelivery can land between the removal and this Mkdir and create
	// the missing folder itself, as the worker does for any missing folder;
	// either way a real folder now stands where the link was.
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		t.Fatalf("%s: %v %v, want a real folder where the link was", dir, fi, err)
	}
	workertest.DataAs[credential.Applied](t, h.waitOutcomes(1)[0], typeApplied)
	h.checkPair("client-one", s1)
	h.assertNoSecret()
}

// plantPair leaves a version 999 pair in dir as another local user could:
// the folder, its files and ..data owned by foreignUID.
func plantPair(t *testing.T, dir string) {
	t.Helper()
	v := filepath.Join(dir, "..v999-planted")
	if err := os.Mkdir(v, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{credential.ClientIDFile: "attacker", credential.SecretFile: "attacker-secret"} {
		if err := os.WriteFile(filepath.Join(v, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		os.Lchown(filepath.Join(v, name), foreignUID, foreignUID)
	}
	if err := os.Symlink("..v999-planted", filepath.Join(dir, credential.DataLink)); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{v, filepath.Join(dir, credential.DataLink)} {
		if err := os.Lchown(p, foreignUID, foreignUID); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPlantedPairIsNotTheAppliedOne is issue 12, finding 9, as the attack:
// in a world-writable credential folder another user planted a version 999
// pair, and the old worker took every later rotation for "older" and
// skipped it. Now the folder is refused until it is closed, the planted
// ..data until it is removed, each loud and retried, and then the rotation
// applies.
func TestPlantedPairIsNotTheAppliedOne(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	h := newHiveWith(t, js, "hive-w", func(cfg *credential.Config) {
		if err := os.Mkdir(cfg.CredentialDir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(cfg.CredentialDir, 0o777); err != nil {
			t.Fatal(err)
		}
		plantPair(t, cfg.CredentialDir)
	})
	dir := h.cfg.CredentialDir
	h.start(h.w.Spec())
	s1 := "s3cr3t-w1-" + randomHex(t)
	h.publish(1, "client-one", h.encrypt(s1))

	loud := h.waitFailures(3, "three deliveries refuse the world-writable folder")
	if !strings.Contains(loud[0], dir+" is writable by group or others (mode drwxrwxrwx) without the sticky bit") || !strings.Contains(loud[0], "the pair was not written") {
		t.Fatalf("the error line does not name the state found and what follows: %v", loud[0])
	}
	if len(workertest.Outcomes(h.t, h.js, credential.Name, h.name)) != 0 {
		t.Fatalf("the rotation was settled (%s) while the folder is open to everyone", workertest.Outcomes(h.t, h.js, credential.Name, h.name)[0].Type())
	}

	// Closed, the folder still holds the planted ..data.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	loud = h.waitFailures(3, "three deliveries refuse the planted ..data")
	if want := filepath.Join(dir, credential.DataLink) + " is owned by uid 65534"; !strings.Contains(loud[len(loud)-1], want) {
		t.Fatalf("the error line does not say %q: %v", want, loud[len(loud)-1])
	}
	if len(workertest.Outcomes(h.t, h.js, credential.Name, h.name)) != 0 || len(workertest.DeadLetters(h.t, h.js, credential.Name, h.name)) != 0 {
		t.Fatal("the planted pair produced an outcome or a dead letter")
	}

	if err := os.Remove(filepath.Join(dir, credential.DataLink)); err != nil {
		t.Fatal(err)
	}
	a := workertest.DataAs[credential.Applied](t, h.waitOutcomes(1)[0], typeApplied)
	if a.Version != 1 {
		t.Fatalf("applied %+v", a)
	}
	h.checkPair("client-one", s1)
	if _, err := os.Lstat(filepath.Join(dir, "..v999-planted")); err != nil {
		t.Errorf("the other user's folder was removed (it is not the worker's): %v", err)
	}
	h.assertNoSecret()
}

// TestDataLinkToAFolderElsewhereIsNotBelieved: ..data names a version
// folder that is itself a link to a pair outside the credential folder.
// The old worker followed it and took version 999 as applied.
func TestDataLinkToAFolderElsewhereIsNotBelieved(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	outside := t.TempDir()
	h := newHiveWith(t, js, "hive-e", func(cfg *credential.Config) {
		if err := os.Mkdir(cfg.CredentialDir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(outside, credential.ClientIDFile), []byte("attacker"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(outside, filepath.Join(cfg.CredentialDir, "..v999-x")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("..v999-x", filepath.Join(cfg.CredentialDir, credential.DataLink)); err != nil {
			t.Fatal(err)
		}
	})
	dir := h.cfg.CredentialDir
	h.start(h.w.Spec())
	s1 := "s3cr3t-e1-" + randomHex(t)
	h.publish(1, "client-one", h.encrypt(s1))
	loud := h.waitFailures(3, "three deliveries refuse the link to elsewhere")
	if !strings.Contains(loud[0], "points to ..v999-x, which is a symbolic link") || !strings.Contains(loud[0], outside) {
		t.Fatalf("the error line does not name the link and where it leads: %v", loud[0])
	}
	if len(workertest.Outcomes(h.t, h.js, credential.Name, h.name)) != 0 || len(workertest.DeadLetters(h.t, h.js, credential.Name, h.name)) != 0 {
		t.Fatalf("the rotation was settled while ..data leads outside the folder")
	}
	for _, name := range []string{credential.DataLink, "..v999-x"} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	workertest.DataAs[credential.Applied](t, h.waitOutcomes(1)[0], typeApplied)
	h.checkPair("client-one", s1)
	if entries, _ := os.ReadDir(outside); len(entries) != 1 {
		t.Fatalf("the folder elsewhere changed: %v", entries)
	}
}
