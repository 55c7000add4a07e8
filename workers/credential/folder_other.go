//go:build !linux

package credential

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// walkFolder is the portable form of the Linux walk: without openat each
// component is checked with Lstat and then used by path, so a parent
// swapped between the two is not caught here (openFolder still checks the
// folder it finally opened). The rules are the same: missing components are
// created 0755, a link in the credential folder's place is never followed,
// and a parent link only when root or the worker's user owns it.
func walkFolder(path string) (*os.File, []string, error) {
	clean := filepath.Clean(path)
	var created []string
	var walk func(p string, last bool) error
	walk = func(p string, last bool) error {
		parent := filepath.Dir(p)
		if parent != p {
			if err := walk(parent, false); err != nil {
				return err
			}
		}
		what := "the parent " + p + " of the credential folder"
		if last {
			what = "the credential folder " + p
		}
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("%s is missing and cannot be created (%w), so the pair was not written; create it (install -d -m 0755 %s) or fix what stops it, and the worker retries", what, err, p)
			} else if err == nil {
				created = append(created, p)
				if err := os.Chmod(p, 0o755); err != nil {
					return fmt.Errorf("set the mode of %s, just created, to 0755: %w; the worker retries", p, err)
				}
			}
			fi, err = os.Lstat(p)
		}
		if err != nil {
			return fmt.Errorf("%s cannot be examined (%w), so the pair was not written; the worker retries", what, err)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			target, _ := os.Readlink(p)
			if last {
				return fmt.Errorf("the credential folder %s is %w (it points to %q), so the pair was not written: a link in the folder's place could send the pair anywhere; replace it with a real folder (install -d -m 0755 %s) and the worker retries", p, errRefusedLink, target, p)
			}
			if uid, ok := fileUID(fi); ok && uid != 0 && uid != workerUID() {
				return fmt.Errorf("the parent %s of the credential folder is a symbolic link to %q owned by uid %d (neither root nor this worker's user), so it is not followed and the pair was not written; replace it and the worker retries", p, target, uid)
			}
			return nil
		}
		if !fi.IsDir() {
			return fmt.Errorf("%s is not a folder (its mode is %v), so the pair was not written; make it a folder and the worker retries", what, fi.Mode())
		}
		return nil
	}
	if err := walk(clean, true); err != nil {
		return nil, nil, err
	}
	f, err := os.Open(clean)
	if err != nil {
		return nil, nil, fmt.Errorf("the credential folder %s cannot be opened (%w), so the pair was not written; the worker retries", clean, err)
	}
	return f, created, nil
}
