package credential

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// folder is the credential folder, opened and checked for one rotation.
// Every file operation of the rotation goes through root, so none of them
// can be led out of the folder by a link, and lock is the descriptor the
// checks were made on (and the flock is held on).
type folder struct {
	// path is the folder's absolute path, for messages and the on-change
	// command's environment.
	path string
	root *os.Root
	lock *os.File
	// created lists the folders this opening made (the credential folder
	// and any missing parents), for the log.
	created []string
	unlock  func()
}

// openFolder makes sure the credential folder exists and can be trusted,
// locks it and opens it as a root. A missing folder, and missing parents,
// are created 0755 as `install -d -m 0755` does (issue 14: nothing else
// creates it), walking from / one component at a time without following a
// link in the folder's place. The folder must then be a real folder owned by
// the worker's user, and writable by group or others only with the sticky
// bit (issue 12, finding 9: in a world-writable folder anyone could plant a
// pair that every later rotation is "older" than). Every failure is one a
// person fixes, so each is an error the rotation is retried on.
func openFolder(path string) (*folder, error) {
	f, created, err := walkFolder(path)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("the credential folder %s cannot be examined (%w), so the pair was not written; the worker retries", path, err)
	}
	if err := checkFolder(path, fi); err != nil {
		f.Close()
		return nil, err
	}
	unlock, err := lockFile(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock the credential folder %s: %w; the pair was not written and the worker retries", path, err)
	}
	fail := func(err error) (*folder, error) {
		unlock()
		f.Close()
		return nil, err
	}
	// os.Root opens by path; the folder it opened must be the one just
	// walked to and checked, not something renamed into its place since.
	root, err := os.OpenRoot(path)
	if err != nil {
		return fail(fmt.Errorf("the credential folder %s cannot be opened (%w), so the pair was not written; the worker retries", path, err))
	}
	rfi, err := root.Stat(".")
	if err != nil || !os.SameFile(fi, rfi) {
		root.Close()
		return fail(fmt.Errorf("the credential folder %s was replaced while it was being checked (%v), so the pair was not written; the worker retries", path, err))
	}
	return &folder{path: path, root: root, lock: f, created: created, unlock: unlock}, nil
}

// close releases the lock and both descriptors; again, it does nothing.
func (fo *folder) close() {
	if fo.root == nil {
		return
	}
	fo.root.Close()
	fo.unlock()
	fo.lock.Close()
	fo.root = nil
}

// sync makes the folder's entries (a swap, a new link) durable.
func (fo *folder) sync() error {
	if err := fo.lock.Sync(); err != nil {
		return fmt.Errorf("fsync the credential folder %s: %w", fo.path, err)
	}
	return nil
}

// checkFolder is the trust rule for the credential folder itself: ..data
// says which pair is current, so whoever can write the folder decides the
// pair. Only the worker's user may: the folder is its own, and group or
// others may write it only with the sticky bit, which keeps them from
// replacing or removing the worker's entries (what they could create there
// is refused by ownership in readApplied).
func checkFolder(path string, fi fs.FileInfo) error {
	if !fi.IsDir() {
		return fmt.Errorf("the credential folder %s is not a folder (its mode is %v), so the pair was not written; make it a folder and the worker retries", path, fi.Mode())
	}
	uid, ok := fileUID(fi)
	if !ok {
		// No owners on this platform (Windows): nothing to check.
		return nil
	}
	if me := workerUID(); uid != me {
		return fmt.Errorf("the credential folder %s is owned by uid %d, not by this worker's user (uid %d), so whoever owns it could plant a pair; the pair was not written; chown it to uid %d and the worker retries", path, uid, me, me)
	}
	if perm := fi.Mode(); perm.Perm()&0o022 != 0 && perm&fs.ModeSticky == 0 {
		return fmt.Errorf("the credential folder %s is writable by group or others (mode %v) without the sticky bit, so anyone could plant a pair there; the pair was not written; chmod go-w %s (0755) and the worker retries", path, perm, path)
	}
	return nil
}

// checkOwned says whether an entry of the credential folder (..data, the
// folder it names) was made by the worker's user; one made by anyone else
// is not trusted to name the current pair.
func checkOwned(what, path string, fi fs.FileInfo) error {
	uid, ok := fileUID(fi)
	if !ok {
		return nil
	}
	if me := workerUID(); uid != me {
		return fmt.Errorf("%s %s is owned by uid %d, not by this worker's user (uid %d): the worker did not make it, so the version it names is not trusted and the pair was not written; remove it and the worker retries", what, path, uid, me)
	}
	return nil
}

// errRefusedLink marks a link found where the worker needs a folder.
var errRefusedLink = errors.New("a symbolic link, which the worker does not follow here")
