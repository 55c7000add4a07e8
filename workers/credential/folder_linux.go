package credential

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// walkFolder opens the folder at the absolute path one component at a time
// from /, each relative to the descriptor of its parent (openat), so what is
// checked is what is opened. A missing component is created 0755 (mkdirat,
// then fchmod, so the umask cannot narrow the mode install -d gives). The
// last component is opened with O_NOFOLLOW: a link there is never followed,
// whoever planted it. A link among the parents is followed only when root or
// the worker's user owns it (as /var/run -> /run is), the rule the kernel's
// protected_symlinks applies in sticky folders; anyone else's is refused.
func walkFolder(path string) (*os.File, []string, error) {
	clean := filepath.Clean(path)
	if !filepath.IsAbs(clean) {
		return nil, nil, fmt.Errorf("the credential folder %s is not an absolute path; the worker retries", path)
	}
	fd, err := syscall.Open("/", syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open / to reach the credential folder %s: %w; the worker retries", clean, err)
	}
	var created []string
	names := strings.Split(strings.TrimPrefix(clean, "/"), "/")
	if clean == "/" {
		names = nil
	}
	for i, name := range names {
		last := i == len(names)-1
		here := "/" + strings.Join(names[:i+1], "/")
		next, made, err := openComponent(fd, name, here, last)
		syscall.Close(fd)
		if err != nil {
			return nil, nil, err
		}
		if made {
			created = append(created, here)
		}
		fd = next
	}
	return os.NewFile(uintptr(fd), clean), created, nil
}

const openDirFlags = syscall.O_RDONLY | syscall.O_DIRECTORY | syscall.O_CLOEXEC

// openComponent opens name in the folder dirfd, creating it when missing.
// here is its full path, for messages; last says it is the credential folder
// itself.
func openComponent(dirfd int, name, here string, last bool) (fd int, made bool, err error) {
	what := "the parent " + here + " of the credential folder"
	if last {
		what = "the credential folder " + here
	}
	fd, err = syscall.Openat(dirfd, name, openDirFlags|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, syscall.ENOENT) {
		err = syscall.Mkdirat(dirfd, name, 0o755)
		switch {
		case err == nil:
			made = true
		case errors.Is(err, syscall.EEXIST):
			// Made meanwhile by someone else: open what is there, with the
			// same checks as if it had been there all along.
		default:
			return -1, false, fmt.Errorf("%s is missing and cannot be created (%w), so the pair was not written; create it (install -d -m 0755 %s) or fix what stops it, and the worker retries", what, err, here)
		}
		fd, err = syscall.Openat(dirfd, name, openDirFlags|syscall.O_NOFOLLOW, 0)
	}
	if errors.Is(err, syscall.ELOOP) || errors.Is(err, syscall.ENOTDIR) {
		// O_NOFOLLOW on a link gives ELOOP, O_DIRECTORY on a file ENOTDIR:
		// look at what is there to say which, and to decide whether a
		// parent link may be followed.
		fi, lerr := os.Lstat(here)
		switch {
		case lerr != nil:
			return -1, false, fmt.Errorf("%s cannot be opened as a folder (%w), so the pair was not written; the worker retries", what, err)
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(here)
			uid, _ := fileUID(fi)
			if last {
				return -1, false, fmt.Errorf("the credential folder %s is %w (it points to %q), so the pair was not written: a link in the folder's place could send the pair anywhere; replace it with a real folder (install -d -m 0755 %s) and the worker retries", here, errRefusedLink, target, here)
			}
			if uid != 0 && uid != workerUID() {
				return -1, false, fmt.Errorf("the parent %s of the credential folder is a symbolic link to %q owned by uid %d (neither root nor this worker's user), so it is not followed and the pair was not written; replace it and the worker retries", here, target, uid)
			}
			fd, err = syscall.Openat(dirfd, name, openDirFlags, 0)
		default:
			return -1, false, fmt.Errorf("%s is not a folder (its mode is %v), so the pair was not written; make it a folder and the worker retries", what, fi.Mode())
		}
	}
	if err != nil {
		return -1, false, fmt.Errorf("%s cannot be opened (%w), so the pair was not written; the worker retries", what, err)
	}
	if made {
		if err := syscall.Fchmod(fd, 0o755); err != nil {
			syscall.Close(fd)
			return -1, false, fmt.Errorf("set the mode of %s, just created, to 0755: %w; the worker retries", here, err)
		}
	}
	return fd, made, nil
}
