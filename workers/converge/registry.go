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
)

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
			client = &http.Client{Timeout: 30 * time.Second}
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
type dirRegistry struct{ root string }

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

func (r dirRegistry) fetch(_ context.Context, version string) (Evidence, error) {
	mPath, sPath, err := r.paths(version)
	if err != nil {
		return Evidence{}, refuse(ruleVersionFormat, "%v, so it names no release in the registry", err)
	}
	read := func(path, what string) ([]byte, error) {
		f, err := os.Open(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, refuse(ruleNotFound, "release %s has no %s in registry %s%s", version, what, r.root, missingNote(what))
		}
		if err != nil {
			return nil, fmt.Errorf("registry %s is not readable: %w", r.root, err)
		}
		defer f.Close()
		return readBounded(f, what)
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
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("registry request %s: %w", u, err)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("registry %s is unreachable: %w", r.base, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK:
		return readBounded(resp.Body, what)
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone:
		return nil, refuse(ruleNotFound, "release %s has no %s in registry %s (HTTP %d)%s", version, what, r.base, resp.StatusCode, missingNote(what))
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusRequestTimeout:
		return nil, fmt.Errorf("registry %s answered HTTP %d for %s; retrying", r.base, resp.StatusCode, what)
	default:
		return nil, refuse(ruleNotFound, "registry %s answered HTTP %d for release %s's %s", r.base, resp.StatusCode, version, what)
	}
}
