package credential

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/steward-dev/steward/workers/workertest"
)

// foreignUID stands for another local user: the tests run as root, so a
// foreign owner is made with Lchown.
const foreignUID = 65534

func mode(t *testing.T, path string) fs.FileMode {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode()
}

// TestFolderIsCreatedLikeInstallD: a missing credential folder and its
// missing parents are made 0755 whatever the umask, the existing parent is
// left as it was, and a second opening creates nothing.
func TestFolderIsCreatedLikeInstallD(t *testing.T) {
	base := t.TempDir()
	if err := os.Chmod(base, 0o700); err != nil {
		t.Fatal(err)
	}
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	dir := filepath.Join(base, "a", "b", "files")
	fo, err := openFolder(dir)
	if err != nil {
		t.Fatal(err)
	}
	fo.close()
	want := []string{filepath.Join(base, "a"), filepath.Join(base, "a", "b"), dir}
	if strings.Join(fo.created, ",") != strings.Join(want, ",") {
		t.Fatalf("created %v, want %v", fo.created, want)
	}
	for _, p := range want {
		if m := mode(t, p); m != fs.ModeDir|0o755 {
			t.Errorf("%s has mode %v, want drwxr-xr-x", p, m)
		}
	}
	if m := mode(t, base); m != fs.ModeDir|0o700 {
		t.Errorf("the existing parent's mode changed to %v", m)
	}
	fo = openAt(t, dir)
	if len(fo.created) != 0 {
		t.Fatalf("a second opening created %v", fo.created)
	}
}

// TestFolderRefusals: what may not stand where the credential folder should
// be, each named in the error, with nothing created through it.
func TestFolderRefusals(t *testing.T) {
	base := t.TempDir()
	elsewhere := filepath.Join(base, "elsewhere")
	if err := os.Mkdir(elsewhere, 0o755); err != nil {
		t.Fatal(err)
	}
	mk := func(name string, setup func(p string)) string {
		p := filepath.Join(base, name)
		setup(p)
		return p
	}
	cases := []struct {
		name, dir, want string
	}{
		{"a link in the folder's place", mk("link", func(p string) { os.Symlink(elsewhere, p) }), "is a symbolic link"},
		{"a dangling link in the folder's place", mk("dangling", func(p string) { os.Symlink(filepath.Join(base, "nowhere"), p) }), "is a symbolic link"},
		{"a file in the folder's place", mk("file", func(p string) { os.WriteFile(p, nil, 0o644) }), "is not a folder"},
		{"a file in a parent's place", filepath.Join(mk("pfile", func(p string) { os.WriteFile(p, nil, 0o644) }), "files"), "the parent " + filepath.Join(base, "pfile") + " of the credential folder is not a folder"},
		{"a parent link owned by another user", filepath.Join(mk("plink", func(p string) {
			os.Symlink(elsewhere, p)
			os.Lchown(p, foreignUID, foreignUID)
		}), "files"), "owned by uid 65534 (neither root nor this worker's user), so it is not followed"},
		{"world-writable", mk("open", func(p string) { os.Mkdir(p, 0o755); os.Chmod(p, 0o777) }), "writable by group or others (mode drwxrwxrwx) without the sticky bit"},
		{"group-writable", mk("group", func(p string) { os.Mkdir(p, 0o755); os.Chmod(p, 0o775) }), "without the sticky bit"},
		{"owned by another user", mk("foreign", func(p string) { os.Mkdir(p, 0o755); os.Lchown(p, foreignUID, foreignUID) }), "is owned by uid 65534, not by this worker's user"},
	}
	for _, c := range cases {
		_, err := openFolder(c.dir)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "the worker retries") {
			t.Errorf("%s: %v; want an error with %q saying it is retried", c.name, err, c.want)
		}
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
		t.Fatalf("something was created through a link: %v", entries)
	}
	if _, err := os.Lstat(filepath.Join(base, "nowhere")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("the dangling link's target was created")
	}
	var link error
	if _, link = openFolder(filepath.Join(base, "link")); !errors.Is(link, errRefusedLink) {
		t.Fatalf("the link refusal does not wrap errRefusedLink: %v", link)
	}

	// Accepted: sticky and world-writable (as /tmp), and a parent link
	// root owns (as /var/run -> /run).
	sticky := mk("sticky", func(p string) { os.Mkdir(p, 0o755); os.Chmod(p, 0o777|fs.ModeSticky) })
	openAt(t, sticky)
	rootLink := mk("rootlink", func(p string) { os.Symlink(elsewhere, p) })
	fo := openAt(t, filepath.Join(rootLink, "files"))
	if fo.created[0] != filepath.Join(rootLink, "files") {
		t.Fatalf("created %v", fo.created)
	}
	if _, err := os.Stat(filepath.Join(elsewhere, "files")); err != nil {
		t.Fatalf("the folder was not made through the root-owned parent link: %v", err)
	}
}

// TestPlantedPairsAreNotBelieved plays issue 12, finding 9: what another
// user could leave in the credential folder to make every later rotation
// "older". The old code read each as version 999 applied; now each is an
// error naming what was found, and a rotation writes nothing.
func TestPlantedPairsAreNotBelieved(t *testing.T) {
	w, recipient := newTestWorker(t)
	plant := func(t *testing.T, dir string) string {
		t.Helper()
		v := filepath.Join(dir, "..v999-planted")
		if err := os.Mkdir(v, 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(v, ClientIDFile), []byte("attacker"), 0o644)
		os.WriteFile(filepath.Join(v, SecretFile), []byte("attacker-secret"), 0o600)
		return v
	}
	cases := []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  string
	}{
		{"world-writable folder, pair planted by another user", func(t *testing.T, dir string) {
			os.Chmod(dir, 0o777)
			v := plant(t, dir)
			os.Symlink("..v999-planted", filepath.Join(dir, DataLink))
			for _, p := range []string{v, filepath.Join(dir, DataLink)} {
				os.Lchown(p, foreignUID, foreignUID)
			}
		}, "without the sticky bit"},
		{"sticky folder, ..data planted by another user", func(t *testing.T, dir string) {
			os.Chmod(dir, 0o777|fs.ModeSticky)
			v := plant(t, dir)
			os.Symlink("..v999-planted", filepath.Join(dir, DataLink))
			for _, p := range []string{v, filepath.Join(dir, DataLink)} {
				os.Lchown(p, foreignUID, foreignUID)
			}
		}, DataLink + " is owned by uid 65534"},
		{"..data names a folder another user made", func(t *testing.T, dir string) {
			v := plant(t, dir)
			os.Lchown(v, foreignUID, foreignUID)
			os.Symlink("..v999-planted", filepath.Join(dir, DataLink))
		}, "the version folder"},
		{"..data names a link to a folder elsewhere", func(t *testing.T, dir string) {
			outside := plant(t, t.TempDir())
			os.Symlink(outside, filepath.Join(dir, "..v999-planted"))
			os.Symlink("..v999-planted", filepath.Join(dir, DataLink))
		}, "which is a symbolic link"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "files")
			os.Mkdir(dir, 0o755)
			c.setup(t, dir)
			_, err := readAt(dir)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("read: %v; want an error with %q", err, c.want)
			}
			ww := *w
			ww.dir = dir
			e := rotationEvent(t, rotation(t, recipient, 1, "client-1", "s3cr3t-1"))
			r := workertest.Work(t, ww.Spec(), &ww, e)
			// Retried with no outcome: a folder a person can fix is never
			// a refusal, and never taken for "nothing applied".
			r.AssertVerdicts(workertest.Retried)
			r.AssertOutcomes()
			err = r.Err()
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), e.ID()) {
				t.Fatalf("rotation %d: error %v; want a retried error naming %q and the event", i, err, c.want)
			}
			if strings.Contains(err.Error(), "s3cr3t") || strings.Contains(err.Error(), "attacker-secret") {
				t.Fatal("a secret is in the error")
			}
		})
	}
}
