package credential

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/steward-dev/steward/internal/atomicfile"
)

// The credential directory's layout, the one Kubernetes' atomic writer
// gives a secret volume:
//
//	<dir>/..v<version>-<random>/secret      0600
//	<dir>/..v<version>-<random>/client_id   0644
//	<dir>/..data -> ..v<version>-<random>
//	<dir>/secret -> ..data/secret
//	<dir>/client_id -> ..data/client_id
//
// A rotation fills a new version folder and renames a new ..data link over
// the old one, so both stable paths move to the new pair in one step.
const (
	// SecretFile and ClientIDFile are the stable names readers open.
	SecretFile   = "secret"
	ClientIDFile = "client_id"
	// DataLink is the link that names the current version folder. A reader
	// that must have both files of one version, whatever rotations happen
	// meanwhile, resolves DataLink once and reads both files inside it.
	DataLink = "..data"

	dataTmpLink   = "..data_tmp"
	versionPrefix = "..v"
	linkTmpSuffix = "_tmp"
)

// applied is what the credential directory holds now: the version ..data
// points to (0 when no pair was ever published) and that folder's name.
type applied struct {
	version uint64
	folder  string
}

// readApplied reads the applied version from the files themselves, so the
// world, not a record beside it, is the source of truth. Anything it cannot
// read is an error, never "nothing applied": taking an unreadable state for
// an empty one would let an old rotation overwrite a newer pair.
func readApplied(dir string) (applied, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return applied{}, fmt.Errorf("the credential directory %s cannot be read (%w); create or mount it and the rotation is retried", dir, err)
	}
	if !fi.IsDir() {
		return applied{}, fmt.Errorf("the credential directory %s is not a folder (its mode is %v); make it a folder and the rotation is retried", dir, fi.Mode())
	}
	target, err := os.Readlink(filepath.Join(dir, DataLink))
	if errors.Is(err, fs.ErrNotExist) {
		return applied{}, nil
	}
	if err != nil {
		return applied{}, fmt.Errorf("%s cannot be read as the link to the current version (%w); move it aside and the rotation is retried", filepath.Join(dir, DataLink), err)
	}
	v, ok := parseVersionFolder(target)
	if !ok {
		return applied{}, fmt.Errorf("%s points to %q, which is not a version folder this worker writes (..v<version>-<suffix>); move it aside and the rotation is retried", filepath.Join(dir, DataLink), target)
	}
	if fi, err := os.Stat(filepath.Join(dir, target)); err != nil || !fi.IsDir() {
		return applied{}, fmt.Errorf("%s points to %s, which is not a readable folder (%v); restore it or move %s aside and the rotation is retried", filepath.Join(dir, DataLink), target, err, DataLink)
	}
	return applied{version: v, folder: target}, nil
}

// parseVersionFolder reads the version out of "..v<version>-<suffix>".
func parseVersionFolder(name string) (uint64, bool) {
	rest, ok := strings.CutPrefix(name, versionPrefix)
	if !ok || strings.ContainsRune(name, '/') {
		return 0, false
	}
	num, suffix, ok := strings.Cut(rest, "-")
	if !ok || suffix == "" {
		return 0, false
	}
	v, err := strconv.ParseUint(num, 10, 64)
	if err != nil || v == 0 || strconv.FormatUint(v, 10) != num {
		return 0, false
	}
	return v, true
}

// writeVersion fills a new version folder with the pair and fsyncs it. On
// failure nothing of it is left behind. It returns the folder's name.
func writeVersion(dir string, version uint64, clientID string, secret []byte) (string, error) {
	folder, err := os.MkdirTemp(dir, versionPrefix+strconv.FormatUint(version, 10)+"-")
	if err != nil {
		return "", fmt.Errorf("create a version folder in %s: %w", dir, err)
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(folder)
		}
	}()
	// Readers of client_id may be other users, as its 0644 says; the secret
	// inside stays 0600.
	if err := os.Chmod(folder, 0o755); err != nil {
		return "", fmt.Errorf("set the mode of %s: %w", folder, err)
	}
	if err := writeNew(filepath.Join(folder, SecretFile), secret, 0o600); err != nil {
		return "", err
	}
	if err := writeNew(filepath.Join(folder, ClientIDFile), []byte(clientID), 0o644); err != nil {
		return "", err
	}
	if err := atomicfile.SyncDir(folder); err != nil {
		return "", err
	}
	ok = true
	return filepath.Base(folder), nil
}

// writeNew creates a file in a fresh version folder and fsyncs it. No temp
// file and rename are needed: nothing points at the folder until the swap,
// so no reader can see the file half written.
func writeNew(path string, data []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer f.Close()
	// The umask may have narrowed perm; the contract's modes are exact.
	if err := f.Chmod(perm); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("write %s: fsync: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// swap points ..data at folder with one rename, the moment both stable
// paths change together, and makes it durable. renamed says whether the
// rename happened: after it, folder is the current pair even if the fsync
// failed.
func swap(dir, folder string) (renamed bool, err error) {
	tmp := filepath.Join(dir, dataTmpLink)
	// A crash between symlink and rename leaves the temporary link; it is
	// ours and points at nothing current. Anything else by that name is
	// not ours to remove, so it stops the swap until an operator looks.
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("%s is in the way of the swap and cannot be removed as a leftover link (%w); move it aside and the rotation is retried", tmp, errors.Unwrap(err))
	}
	if err := os.Symlink(folder, tmp); err != nil {
		return false, fmt.Errorf("link %s to %s: %w", tmp, folder, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, DataLink)); err != nil {
		os.Remove(tmp)
		return false, fmt.Errorf("rename %s over %s: %w", tmp, DataLink, err)
	}
	return true, atomicfile.SyncDir(dir)
}

// ensureLinks makes the stable paths point into ..data. They are created
// once; a path that holds something else (a file an older deployment wrote)
// is replaced by a rename, so a reader sees the old file or the new link.
func ensureLinks(dir string) error {
	changed := false
	for _, name := range []string{SecretFile, ClientIDFile} {
		path := filepath.Join(dir, name)
		want := DataLink + "/" + name
		if got, err := os.Readlink(path); err == nil && got == want {
			continue
		}
		tmp := path + linkTmpSuffix
		if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s is in the way of the stable link and cannot be removed as a leftover link (%w); move it aside and the rotation is retried", tmp, errors.Unwrap(err))
		}
		if err := os.Symlink(want, tmp); err != nil {
			return fmt.Errorf("link %s to %s: %w", tmp, want, err)
		}
		if err := os.Rename(tmp, path); err != nil {
			os.Remove(tmp)
			return fmt.Errorf("rename %s over %s: %w", tmp, path, err)
		}
		changed = true
	}
	if changed {
		if err := atomicfile.SyncDir(dir); err != nil {
			return err
		}
	}
	return nil
}

// cleanup removes version folders other than the current one and the one
// it replaced. The replaced one is kept for one more rotation because a
// reader may have resolved ..data just before the swap and not yet opened
// the file inside; removing it at once would show that reader a missing
// file. It returns what it could not remove; the pair is in place anyway.
func cleanup(dir, current, previous string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if name == current || name == previous || !strings.HasPrefix(name, versionPrefix) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
