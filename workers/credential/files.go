package credential

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

// applied is what the credential folder holds now: the version ..data
// points to (0 when no pair was ever published) and that folder's name.
type applied struct {
	version uint64
	folder  string
}

// readApplied reads the applied version from the files themselves, so the
// world, not a record beside it, is the source of truth. Anything it cannot
// read is an error, never "nothing applied": taking an unreadable state for
// an empty one would let an old rotation overwrite a newer pair. ..data is
// believed only as a link the worker's user made, naming a real folder of
// the credential folder that user made (issue 12, finding 9): a pair
// planted by anyone else, or reached through a link to somewhere else, is
// not the applied one, whatever version it claims.
func readApplied(fo *folder) (applied, error) {
	data := filepath.Join(fo.path, DataLink)
	li, err := fo.root.Lstat(DataLink)
	if errors.Is(err, fs.ErrNotExist) {
		return applied{}, nil
	}
	if err != nil {
		return applied{}, fmt.Errorf("%s cannot be examined (%w), so the applied version is unknown and the pair was not written; the worker retries", data, err)
	}
	if li.Mode()&fs.ModeSymlink == 0 {
		return applied{}, fmt.Errorf("%s is not the link to the current version but a %v, so the pair was not written; move it aside and the worker retries", data, li.Mode().Type())
	}
	if err := checkOwned("the link", data, li); err != nil {
		return applied{}, err
	}
	target, err := fo.root.Readlink(DataLink)
	if err != nil {
		return applied{}, fmt.Errorf("%s cannot be read as the link to the current version (%w), so the pair was not written; move it aside and the worker retries", data, err)
	}
	v, ok := parseVersionFolder(target)
	if !ok {
		return applied{}, fmt.Errorf("%s points to %q, which is not a version folder this worker writes (..v<version>-<suffix> in %s), so the pair was not written; move it aside and the worker retries", data, target, fo.path)
	}
	ti, err := fo.root.Lstat(target)
	switch {
	case err != nil:
		return applied{}, fmt.Errorf("%s points to %s, which cannot be examined (%w), so the pair was not written; restore it or move %s aside and the worker retries", data, target, err, DataLink)
	case ti.Mode()&fs.ModeSymlink != 0:
		dest, _ := fo.root.Readlink(target)
		return applied{}, fmt.Errorf("%s points to %s, which is %w (to %q), not a folder the worker wrote, so the pair was not written; remove %s and %s and the worker retries", data, target, errRefusedLink, dest, target, DataLink)
	case !ti.IsDir():
		return applied{}, fmt.Errorf("%s points to %s, which is not a folder (its mode is %v), so the pair was not written; restore it or move %s aside and the worker retries", data, target, ti.Mode(), DataLink)
	}
	if err := checkOwned("the version folder", filepath.Join(fo.path, target), ti); err != nil {
		return applied{}, err
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
func writeVersion(fo *folder, version uint64, clientID string, secret []byte) (string, error) {
	name, err := makeVersionFolder(fo, version)
	if err != nil {
		return "", err
	}
	ok := false
	defer func() {
		if !ok {
			fo.root.RemoveAll(name)
		}
	}()
	d, err := fo.root.Open(name)
	if err != nil {
		return "", fmt.Errorf("open the version folder %s: %w", filepath.Join(fo.path, name), err)
	}
	defer d.Close()
	// Readers of client_id may be other users, as its 0644 says; the secret
	// inside stays 0600. Set through the descriptor, so the umask cannot
	// narrow it.
	if err := d.Chmod(0o755); err != nil {
		return "", fmt.Errorf("set the mode of %s: %w", filepath.Join(fo.path, name), err)
	}
	if err := writeNew(fo, name+"/"+SecretFile, secret, 0o600); err != nil {
		return "", err
	}
	if err := writeNew(fo, name+"/"+ClientIDFile, []byte(clientID), 0o644); err != nil {
		return "", err
	}
	if err := d.Sync(); err != nil {
		return "", fmt.Errorf("fsync %s: %w", filepath.Join(fo.path, name), err)
	}
	ok = true
	return name, nil
}

// makeVersionFolder creates an empty ..v<version>-<random> folder, as
// os.MkdirTemp would, but inside the root.
func makeVersionFolder(fo *folder, version uint64) (string, error) {
	prefix := versionPrefix + strconv.FormatUint(version, 10) + "-"
	for range 100 {
		var b [6]byte
		rand.Read(b[:])
		name := prefix + hex.EncodeToString(b[:])
		err := fo.root.Mkdir(name, 0o700)
		if err == nil {
			return name, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", fmt.Errorf("create a version folder in %s: %w", fo.path, err)
		}
	}
	return "", fmt.Errorf("create a version folder in %s: 100 random names were taken", fo.path)
}

// writeNew creates a file in a fresh version folder and fsyncs it. No temp
// file and rename are needed: nothing points at the folder until the swap,
// so no reader can see the file half written.
func writeNew(fo *folder, name string, data []byte, perm os.FileMode) error {
	path := filepath.Join(fo.path, name)
	f, err := fo.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
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
func swap(fo *folder, name string) (renamed bool, err error) {
	tmp := filepath.Join(fo.path, dataTmpLink)
	// A crash between symlink and rename leaves the temporary link; it is
	// ours and points at nothing current. Anything else by that name is
	// not ours to remove, so it stops the swap until an operator looks.
	if err := fo.root.Remove(dataTmpLink); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("%s is in the way of the swap and cannot be removed as a leftover link (%w); move it aside and the rotation is retried", tmp, errors.Unwrap(err))
	}
	if err := fo.root.Symlink(name, dataTmpLink); err != nil {
		return false, fmt.Errorf("link %s to %s: %w", tmp, name, err)
	}
	if err := fo.root.Rename(dataTmpLink, DataLink); err != nil {
		fo.root.Remove(dataTmpLink)
		return false, fmt.Errorf("rename %s over %s: %w", tmp, DataLink, err)
	}
	return true, fo.sync()
}

// ensureLinks makes the stable paths point into ..data. They are created
// once; a path that holds something else (a file an older deployment wrote)
// is replaced by a rename, so a reader sees the old file or the new link.
func ensureLinks(fo *folder) error {
	changed := false
	for _, name := range []string{SecretFile, ClientIDFile} {
		path := filepath.Join(fo.path, name)
		want := DataLink + "/" + name
		if got, err := fo.root.Readlink(name); err == nil && got == want {
			continue
		}
		tmp := name + linkTmpSuffix
		if err := fo.root.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s is in the way of the stable link and cannot be removed as a leftover link (%w); move it aside and the rotation is retried", filepath.Join(fo.path, tmp), errors.Unwrap(err))
		}
		if err := fo.root.Symlink(want, tmp); err != nil {
			return fmt.Errorf("link %s to %s: %w", filepath.Join(fo.path, tmp), want, err)
		}
		if err := fo.root.Rename(tmp, name); err != nil {
			fo.root.Remove(tmp)
			return fmt.Errorf("rename %s over %s: %w", filepath.Join(fo.path, tmp), path, err)
		}
		changed = true
	}
	if changed {
		return fo.sync()
	}
	return nil
}

// cleanup removes version folders other than the current one and the one
// it replaced. The replaced one is kept for one more rotation because a
// reader may have resolved ..data just before the swap and not yet opened
// the file inside; removing it at once would show that reader a missing
// file. Only real folders the worker's user made are removed: anything else
// named like one is not the worker's (readApplied never believes it). It
// returns what it could not remove; the pair is in place anyway.
func cleanup(fo *folder, current, previous string) error {
	d, err := fo.root.Open(".")
	if err != nil {
		return err
	}
	entries, err := d.ReadDir(-1)
	d.Close()
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if name == current || name == previous || !strings.HasPrefix(name, versionPrefix) || !e.IsDir() {
			continue
		}
		if fi, err := e.Info(); err != nil || checkOwned("", name, fi) != nil {
			continue
		}
		if err := fo.root.RemoveAll(name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
