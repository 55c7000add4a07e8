package converge

import (
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/signing"
)

// The runners a converge worker can use.
const (
	// RunnerCloudRun runs the release's ops image as a Cloud Run job.
	RunnerCloudRun = "cloudrun"
	// RunnerExec runs a local command, for development and compose.
	RunnerExec = "exec"
)

// DefaultTaskTimeout bounds one run of the ops job. An upgrade that takes
// longer is stuck, and Cloud Run ends it as failed.
const DefaultTaskTimeout = time.Hour

// MaxTaskTimeout is the longest task timeout Cloud Run accepts for a job.
const MaxTaskTimeout = 168 * time.Hour

// Config is a converge worker instance's configuration. Every field has a
// flag (AddFlags) whose STEWARD_* environment twin cmd/steward maps.
type Config struct {
	// Install is the install this worker converges (--install); it names
	// the durable consumer and the outcomes' subject.
	Install string
	// Registry is where releases are read: a directory or an https base
	// URL holding <version>/manifest.json and manifest.json.sigstore.json (or the legacy manifest.json.sig).
	Registry string
	// ReleaseKey is the set of public keys releases are signed with: a PEM
	// (PKIX) file holding one or more PUBLIC KEY blocks, each ECDSA P-256 as
	// cosign writes it or ed25519, or several such files separated by
	// commas (signing.LoadPublicKeys). A release signed by any key of the
	// set verifies, so a key is rotated by adding the new one, publishing
	// with it, then removing the old one.
	ReleaseKey string
	// InstalledVersion is the version the install runs when this worker
	// first starts. Once the worker has recorded a version it is ignored.
	InstalledVersion string
	// Reseed makes the worker believe InstalledVersion when the recorded
	// installed version cannot be believed and the runner cannot rebuild
	// it: the operator vouches for it, and the worker writes it as its own
	// signed seed. Remove it once the install converges.
	Reseed bool
	// Runner is RunnerCloudRun or RunnerExec.
	Runner string
	// ExecCommand is the shell command the exec runner runs (sh -c).
	ExecCommand string
	// ExecRecordDir is where the exec runner keeps its record of
	// executions (--exec-record-dir), one file each: what Cloud Run's
	// execution list is to the cloudrun runner. Without it the exec
	// runner knows only the commands of its own process (see execRunner).
	ExecRecordDir string
	// TaskTimeout bounds one run of the ops job (both runners).
	TaskTimeout time.Duration

	// The cloudrun runner's settings: the job lives at
	// projects/<CloudRunProject>/locations/<CloudRunRegion>/jobs/<CloudRunJob>.
	CloudRunProject string
	CloudRunRegion  string
	CloudRunJob     string
	// CloudRunServiceAccount is the identity the ops job runs as.
	CloudRunServiceAccount string
	// CloudRunAdminMember is the IAM member (user:, group:,
	// serviceAccount: or domain:) who may run and view the job.
	CloudRunAdminMember string
	// CloudRunNetwork and CloudRunSubnet give the job Direct VPC egress
	// when set.
	CloudRunNetwork string
	CloudRunSubnet  string
	// CloudRunEndpoint points the client at an emulator or test server,
	// in plaintext and without authentication. Empty means Google's API.
	CloudRunEndpoint string

	// httpClient fetches from an https registry; tests give one that
	// trusts their server's certificate.
	httpClient *http.Client
	// pollInterval is how often a running execution is looked at.
	pollInterval time.Duration
}

// AddFlags registers the converge flags on fs, named as docs/design.md §6's
// STEWARD_* settings without the prefix.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Install, "install", c.Install, "the install this worker converges (one subject token)")
	fs.StringVar(&c.Registry, "registry", c.Registry, "release registry: a directory or an https base URL holding <version>/manifest.json and manifest.json.sigstore.json (or the legacy manifest.json.sig)")
	fs.StringVar(&c.ReleaseKey, "release-key", c.ReleaseKey, "PEM (PKIX) public keys that sign releases (ECDSA P-256 as cosign writes it, or ed25519): one file with one or more PUBLIC KEY blocks, or files separated by commas; a release signed by any of them verifies, so a key is rotated by adding the new one, then removing the old")
	fs.StringVar(&c.InstalledVersion, "installed-version", c.InstalledVersion, "version the install runs at the worker's first start (ignored once a version is recorded)")
	fs.BoolVar(&c.Reseed, "reseed", c.Reseed, "believe --installed-version when the recorded installed version does not verify and the runner cannot rebuild it (the held release names this); remove it once the install converges")
	runner := c.Runner
	if runner == "" {
		runner = RunnerCloudRun
	}
	fs.StringVar(&c.Runner, "runner", runner, "how the ops job runs: cloudrun or exec")
	fs.StringVar(&c.ExecCommand, "exec-command", c.ExecCommand, "exec runner: shell command run with STEWARD_IMAGE, STEWARD_TARGET_VERSION, STEWARD_INSTALL and STEWARD_FROM_VERSION set")
	fs.StringVar(&c.ExecRecordDir, "exec-record-dir", c.ExecRecordDir, "exec runner: directory where it records every execution (event, version, image, result), so a checkpoint's claim is checked against it and the installed version can be rebuilt from it; without it a removed installed-version document reads as a first start")
	timeout := c.TaskTimeout
	if timeout == 0 {
		timeout = DefaultTaskTimeout
	}
	fs.DurationVar(&c.TaskTimeout, "task-timeout", timeout, "longest one run of the ops job may take")
	fs.StringVar(&c.CloudRunProject, "cloudrun-project", c.CloudRunProject, "cloudrun runner: Google Cloud project of the ops job")
	fs.StringVar(&c.CloudRunRegion, "cloudrun-region", c.CloudRunRegion, "cloudrun runner: region of the ops job")
	fs.StringVar(&c.CloudRunJob, "cloudrun-job", c.CloudRunJob, "cloudrun runner: name of the ops job")
	fs.StringVar(&c.CloudRunServiceAccount, "cloudrun-service-account", c.CloudRunServiceAccount, "cloudrun runner: service account e-mail the ops job runs as")
	fs.StringVar(&c.CloudRunAdminMember, "cloudrun-admin-member", c.CloudRunAdminMember, "cloudrun runner: IAM member granted roles/run.jobsExecutor and roles/run.viewer on the job")
	fs.StringVar(&c.CloudRunNetwork, "cloudrun-network", c.CloudRunNetwork, "cloudrun runner: VPC network for Direct VPC egress (optional)")
	fs.StringVar(&c.CloudRunSubnet, "cloudrun-subnet", c.CloudRunSubnet, "cloudrun runner: VPC subnetwork for Direct VPC egress (optional)")
	fs.StringVar(&c.CloudRunEndpoint, "cloudrun-endpoint", c.CloudRunEndpoint, "cloudrun runner: host:port of an emulator or test server (plaintext, no authentication)")
}

var (
	// Cloud Run's own rules, so nothing else reaches a resource name.
	projectPattern = regexp.MustCompile(`^(?:[a-z][a-z0-9.-]{0,62}:)?[a-z][a-z0-9-]{4,28}[a-z0-9]$`)
	regionPattern  = regexp.MustCompile(`^[a-z]+(?:-[a-z]+)+[0-9]+$`)
	jobPattern     = regexp.MustCompile(`^[a-z](?:[a-z0-9-]{0,47}[a-z0-9])?$`)
	saPattern      = regexp.MustCompile(`^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}$`)
	memberPattern  = regexp.MustCompile(`^(?:user|group|serviceAccount):[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}$|^domain:[A-Za-z0-9.-]+\.[A-Za-z]{2,}$`)
	// A network or subnet is a name or a resource path of names.
	vpcPattern = regexp.MustCompile(`^[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?$|^projects/[a-z0-9.:-]+/(?:global/networks|regions/[a-z0-9-]+/subnetworks)/[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?$`)
)

// checked is a Config that passed validation, with what it loaded.
type checked struct {
	Config
	keys     releaseKeys
	registry registry
}

func (c Config) check() (*checked, error) {
	if err := events.CheckKey(c.Install); err != nil {
		return nil, fmt.Errorf("--install: %w", err)
	}
	if c.Registry == "" {
		return nil, fmt.Errorf("--registry is required: a directory or an https base URL holding <version>/manifest.json and manifest.json.sigstore.json (or the legacy manifest.json.sig)")
	}
	reg, err := newRegistry(c.Registry, c.httpClient)
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(c.ReleaseKey) == "" {
		return nil, fmt.Errorf("--release-key is required: the PEM public keys releases are signed with (one file with one or more PUBLIC KEY blocks, or files separated by commas)")
	}
	set, err := signing.LoadPublicKeys(c.ReleaseKey)
	if err != nil {
		return nil, fmt.Errorf("--release-key: %w", err)
	}
	keys := newReleaseKeys(set.Keys()...)
	if c.InstalledVersion != "" {
		if err := events.CheckVersion(c.InstalledVersion); err != nil {
			return nil, fmt.Errorf("--installed-version: %w", err)
		}
	}
	if c.TaskTimeout == 0 {
		c.TaskTimeout = DefaultTaskTimeout
	}
	if c.TaskTimeout < time.Second || c.TaskTimeout > MaxTaskTimeout {
		return nil, fmt.Errorf("--task-timeout %v must be between 1s and %v", c.TaskTimeout, MaxTaskTimeout)
	}
	if c.pollInterval <= 0 {
		c.pollInterval = 10 * time.Second
	}
	switch c.Runner {
	case RunnerExec:
		if strings.TrimSpace(c.ExecCommand) == "" {
			return nil, fmt.Errorf("--exec-command is required with --runner exec")
		}
		if c.ExecRecordDir != "" {
			// Made here, so a directory that cannot be written stops
			// the worker at its start rather than at its first release.
			if err := os.MkdirAll(c.ExecRecordDir, 0o700); err != nil {
				return nil, fmt.Errorf("--exec-record-dir: %w", err)
			}
		}
	case RunnerCloudRun:
		if err := c.checkCloudRun(); err != nil {
			return nil, err
		}
	case "":
		return nil, fmt.Errorf("--runner is required: %s or %s", RunnerCloudRun, RunnerExec)
	default:
		return nil, fmt.Errorf("--runner %q: the runners are %s and %s", c.Runner, RunnerCloudRun, RunnerExec)
	}
	return &checked{Config: c, keys: keys, registry: reg}, nil
}

func (c Config) checkCloudRun() error {
	for _, f := range []struct {
		flag, value string
		re          *regexp.Regexp
		rule        string
	}{
		{"--cloudrun-project", c.CloudRunProject, projectPattern, "a Google Cloud project id (6-30 lowercase letters, digits or '-')"},
		{"--cloudrun-region", c.CloudRunRegion, regionPattern, "a Cloud Run region such as europe-west1"},
		{"--cloudrun-job", c.CloudRunJob, jobPattern, "a Cloud Run job name (a lowercase letter, then up to 48 lowercase letters, digits or '-', not ending in '-')"},
		{"--cloudrun-service-account", c.CloudRunServiceAccount, saPattern, "a service account e-mail"},
		{"--cloudrun-admin-member", c.CloudRunAdminMember, memberPattern, "an IAM member: user:, group: or serviceAccount: and an e-mail, or domain: and a domain"},
	} {
		if f.value == "" {
			return fmt.Errorf("%s is required with --runner %s: %s", f.flag, RunnerCloudRun, f.rule)
		}
		if !f.re.MatchString(f.value) {
			return fmt.Errorf("%s %q is not %s", f.flag, f.value, f.rule)
		}
	}
	for _, f := range []struct{ flag, value string }{{"--cloudrun-network", c.CloudRunNetwork}, {"--cloudrun-subnet", c.CloudRunSubnet}} {
		if f.value != "" && !vpcPattern.MatchString(f.value) {
			return fmt.Errorf("%s %q is not a VPC name or projects/... resource path", f.flag, f.value)
		}
	}
	if c.CloudRunEndpoint != "" {
		if u, err := url.Parse("grpc://" + c.CloudRunEndpoint); err != nil || u.Host != c.CloudRunEndpoint || u.Port() == "" {
			return fmt.Errorf("--cloudrun-endpoint %q is not host:port", c.CloudRunEndpoint)
		}
	}
	return nil
}

// releaseKey is one key of the release key set with the id messages name
// it by.
type releaseKey struct {
	pub crypto.PublicKey
	id  string
}

// releaseKeys is the release key set: a release signed by any one of them
// verifies.
type releaseKeys []releaseKey

func newReleaseKeys(pubs ...crypto.PublicKey) releaseKeys {
	ks := make(releaseKeys, 0, len(pubs))
	for _, p := range pubs {
		ks = append(ks, releaseKey{pub: p, id: keyID(p)})
	}
	return ks
}

// String names the set in messages: "the release key sha256:…" for one
// key, "any of the 2 release keys (sha256:…, sha256:…)" for several.
func (ks releaseKeys) String() string {
	if len(ks) == 1 {
		return "the release key " + ks[0].id
	}
	ids := make([]string, len(ks))
	for i, k := range ks {
		ids[i] = k.id
	}
	return fmt.Sprintf("any of the %d release keys (%s)", len(ks), strings.Join(ids, ", "))
}

// keyID names a public key in messages: the first 16 hex digits of the
// SHA-256 of its PKIX encoding, so an operator can tell keys apart.
func keyID(pub crypto.PublicKey) string {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "unknown"
	}
	sum := sha256.Sum256(der)
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// fileExists reports whether path names something; errors other than "not
// there" count as present, so a file that cannot be read is never replaced.
func fileExists(path string) bool {
	_, err := os.Stat(path)
	return !os.IsNotExist(err)
}
