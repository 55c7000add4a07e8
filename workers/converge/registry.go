package converge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/steward-dev/steward/events"
)

// The files of a release in a registry.
const (
	ManifestFile  = "manifest.json"
	SignatureFile = "manifest.json.sig"
	// maxManifestSize bounds what is read from a registry: a manifest is a
	// few hundred bytes, and a registry must not make the worker read a
	// gigabyte.
	maxManifestSize = 64 << 10
	// registryTimeout bounds one read of one registry file, local or
	// https: a registry that does not answer must not hold the install's
	// converge (one release at a time) for ever; the read is retried.
	registryTimeout = 30 * time.Second
)

// ruleNotRegular: a registry file that is not a regular file (a FIFO, a
// device, a directory), which is never read.
const ruleNotRegular = "not-regular-file"

// registry reads a release's manifest and signature.
type registry interface {
	// fetch returns the manifest and signature bytes of version. A
	// release that is not there is a *refusal; a registry that cannot be
	// reached is any other error, which a retry may fix.
	fetch(ctx context.Context, version string) (Evidence, error)
	String() string
}

func newRegistry(loc string, client *http.Client) (registry, error) {
	if strings.Contains(loc, "://") {
		u, err := url.Parse(loc)
		if err != nil {
			return nil, fmt.Errorf("--registry %q is not a URL: %w", loc, err)
		}
		if u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			return nil, fmt.Errorf("--registry %q: a registry URL is https://host/path, without credentials, query or fragment", loc)
		}
		if client == nil {
			client = &http.Client{Timeout: registryTimeout}
		}
		u.Path = strings.TrimSuffix(u.Path, "/")
		u.RawPath = ""
		return httpsRegistry{base: u, client: client}, nil
	}
	abs, err := filepath.Abs(loc)
	if err != nil {
		return nil, fmt.Errorf("--registry %q: %w", loc, err)
	}
	st, err := os.Stat(abs)
	if err != nil {
		return nil, fmt.Errorf("--registry %q: %w", loc, err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("--registry %q is not a directory (or an https URL)", loc)
	}
	return dirRegistry{root: abs}, nil
}

// releasePath is where a release lives under a registry's root. The version
// is checked first, so a version can never name a path outside its own
// folder ("../", an absolute path, a URL): nothing unchecked reaches a path.
func releasePath(version string) (string, error) {
	if err := events.CheckVersion(version); err != nil {
		return "", err
	}
	if !filepath.IsLocal(version) || strings.ContainsAny(version, `/\`) {
		return "", fmt.Errorf("version %q is not a plain folder name", version)
	}
	return version, nil
}

// dirRegistry is a registry in a local directory (a mounted volume, or the
// development registry `steward dev` writes).
type dirRegistry struct {
	root string
	// timeout bounds one file's read; 0 is registryTimeout.
	timeout time.Duration
}

func (r dirRegistry) String() string { return r.root }

// paths returns the manifest and signature files of version.
func (r dirRegistry) paths(version string) (manifest, sig string, err error) {
	rel, err := releasePath(version)
	if err != nil {
		return "", "", err
	}
	dir := filepath.Join(r.root, rel)
	return filepath.Join(dir, ManifestFile), filepath.Join(dir, SignatureFile), nil
}

func (r dirRegistry) fetch(ctx context.Context, version string) (Evidence, error) {
	mPath, sPath, err := r.paths(version)
	if err != nil {
		return Evidence{}, refuse(ruleVersionFormat, "%v, so it names no release in the registry", err)
	}
	read := func(path, what string) ([]byte, error) {
		return r.read(ctx, version, path, what)
	}
	m, err := read(mPath, ManifestFile)
	if err != nil {
		return Evidence{}, err
	}
	// Either signature file may be missing; only both missing is an
	// unsigned release.
	b, err := read(filepath.Join(filepath.Dir(mPath), BundleFile), BundleFile)
	if err != nil && !isNotFound(err) {
		return Evidence{}, err
	}
	s, err := read(sPath, SignatureFile)
	if err != nil && !isNotFound(err) {
		return Evidence{}, err
	}
	return signed(version, r.root, m, b, s)
}

// read reads one release file, which must be a regular file, within the
// registry's deadline (issue 12, finding 11). A FIFO would block open and
// read until someone writes to it, stalling the install's converge for ever
// (converge runs one release at a time); a device never ends. So the file
// is opened without blocking, refused unless fstat says it is regular, and
// read under a deadline that a hung mount cannot outlast.
func (r dirRegistry) read(ctx context.Context, version, path, what string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, r.readTimeout())
	defer cancel()
	type answer struct {
		b   []byte
		err error
	}
	done := make(chan answer, 1)
	go func() {
		b, err := r.readRegular(version, path, what)
		done <- answer{b, err}
	}()
	select {
	case a := <-done:
		return a.b, a.err
	case <-ctx.Done():
		// The reading goroutine ends with the read it is stuck in; the
		// retry decides again.
		return nil, fmt.Errorf("registry %s: reading release %s's %s did not finish within %v: %w", r.root, version, what, r.readTimeout(), ctx.Err())
	}
}

func (r dirRegistry) readRegular(version, path, what string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, refuse(ruleNotFound, "release %s has no %s in registry %s%s", version, what, r.root, missingNote(what))
	}
	if err != nil {
		return nil, fmt.Errorf("registry %s is not readable: %w", r.root, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("registry %s: stat %s: %w", r.root, path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, refuse(ruleNotRegular, "release %s's %s in registry %s is a %s, not a regular file, so it is not read and nothing ran; replace it with the file itself", version, what, r.root, fileKind(st.Mode()))
	}
	return readBounded(f, what)
}

// readTimeout is how long one registry file may take to read.
func (r dirRegistry) readTimeout() time.Duration {
	if r.timeout > 0 {
		return r.timeout
	}
	return registryTimeout
}

// fileKind names what a non-regular file is, for the refusal.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "named pipe (FIFO)"
	case m&fs.ModeDevice != 0, m&fs.ModeCharDevice != 0:
		return "device"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m.IsDir():
		return "directory"
	}
	return "non-regular file (" + m.Type().String() + ")"
}

// isNotFound reports whether err is the refusal for a file a registry does
// not hold.
func isNotFound(err error) bool {
	var r *refusal
	return errors.As(err, &r) && r.rule == ruleNotFound
}

// signed assembles a release's evidence, refusing a release with neither
// signature file.
func signed(version, where string, m, bundle, sig []byte) (Evidence, error) {
	if bundle == nil && sig == nil {
		return Evidence{}, refuse(ruleNotFound, "release %s has neither %s nor %s in registry %s%s", version, BundleFile, SignatureFile, where, missingNote(SignatureFile))
	}
	return Evidence{Manifest: m, Bundle: bundle, Signature: sig}, nil
}

func missingNote(what string) string {
	if what == SignatureFile {
		return "; an unsigned release is never applied"
	}
	return "; publish it there first, or check the version"
}

func readBounded(r io.Reader, what string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxManifestSize+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	if len(b) > maxManifestSize {
		return nil, refuse(ruleManifest, "%s is larger than %d bytes, which no release manifest is", what, maxManifestSize)
	}
	return b, nil
}

// httpsRegistry is a registry behind an https base URL (a bucket, a static
// site). TLS protects the transfer; the signature is what is trusted.
type httpsRegistry struct {
	base   *url.URL
	client *http.Client
	// timeout bounds one file's request and body; 0 is registryTimeout.
	// It holds whatever client is given, even one without a Timeout.
	timeout time.Duration
}

func (r httpsRegistry) String() string { return r.base.String() }

// urls returns the manifest and signature URLs of version.
func (r httpsRegistry) urls(version string) (manifest, sig string, err error) {
	rel, err := releasePath(version)
	if err != nil {
		return "", "", err
	}
	dir := r.base.JoinPath(rel)
	return dir.JoinPath(ManifestFile).String(), dir.JoinPath(SignatureFile).String(), nil
}

func (r httpsRegistry) fetch(ctx context.Context, version string) (Evidence, error) {
	mURL, sURL, err := r.urls(version)
	if err != nil {
		return Evidence{}, refuse(ruleVersionFormat, "%v, so it names no release in the registry", err)
	}
	m, err := r.get(ctx, version, mURL, ManifestFile)
	if err != nil {
		return Evidence{}, err
	}
	bURL := strings.TrimSuffix(mURL, ManifestFile) + BundleFile
	b, err := r.get(ctx, version, bURL, BundleFile)
	if err != nil && !isNotFound(err) {
		return Evidence{}, err
	}
	s, err := r.get(ctx, version, sURL, SignatureFile)
	if err != nil && !isNotFound(err) {
		return Evidence{}, err
	}
	return signed(version, r.base.String(), m, b, s)
}

func (r httpsRegistry) get(ctx context.Context, version, u, what string) ([]byte, error) {
	timeout := r.timeout
	if timeout <= 0 {
		timeout = registryTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("registry request %s: %w", u, err)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("registry %s is unreachable (or did not answer within %v): %w", r.base, timeout, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK:
		b, err := readBounded(resp.Body, what)
		if err != nil && ctx.Err() != nil {
			return nil, fmt.Errorf("registry %s: %s did not arrive within %v: %w", r.base, what, timeout, err)
		}
		return b, err
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone:
		return nil, refuse(ruleNotFound, "release %s has no %s in registry %s (HTTP %d)%s", version, what, r.base, resp.StatusCode, missingNote(what))
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusRequestTimeout:
		return nil, fmt.Errorf("registry %s answered HTTP %d for %s; retrying", r.base, resp.StatusCode, what)
	default:
		return nil, refuse(ruleNotFound, "registry %s answered HTTP %d for release %s's %s", r.base, resp.StatusCode, version, what)
	}
}
