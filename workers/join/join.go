// Package join is the join worker: it runs on a box, as the box, and arms
// the box's host guard when the console invites it. An invitation grants
// nothing by itself; it is the console's signed statement that this box,
// with this identity record, may enroll. The worker verifies it, and the
// deployment's host floor signed by the release key, before it writes the
// guard's policy and enrollment and runs the arm command.
//
// Events handled (docs/design.md §2, §5):
//   - dev.steward.hostfloor.published.v1: a verified floor for this
//     deployment is kept in the worker's state ("floor"), the newest by
//     minAgentVersion: the version is signed, a stream sequence is not, so
//     a republished old floor never rolls the floor back. Outcomes
//     floor-accepted, floor-kept (not newer) and floor-refused (a policy
//     refusal: settled with its outcome, never a dead letter). Another
//     deployment's floor is acknowledged and logged.
//   - dev.steward.invitation.written.v1 for this box: verified first
//     (nothing its payload says is used before); armed-already when the
//     marker names this box and the verified enrollment; otherwise
//     <opt>/system/join/enrollment.json and policy.json are written durably
//     and the arm command runs; the outcome is armed. A refusal is the
//     outcome refused with the rule that failed, and the event is settled
//     (workers.Refused), never a dead letter: sending it again would be
//     refused again. Invitations are ordered by their signed issuedAt
//     (state "invitation"): one older than the newest accepted, for another
//     enrollment, is superseded (a refusal too) and changes nothing. A
//     newer invitation for another enrollment re-arms the box. One issued
//     further ahead of this box's clock than MaxClockSkew is refused, since
//     it would supersede every later invitation until its time came.
//
// Stored state is a cache, never proof (docs/design.md §2): the kept floor and the
// newest accepted invitation are kept as the DSSE envelopes received, and
// verified again with their keys every time they are read. A document that
// does not verify (forged, or written by a Steward that kept no evidence)
// is taken neither as a floor or an order nor as their absence: the
// invitation that needed it is refused with what was found and the command
// that recovers (republish the floor; delete the order document and
// publish the invitation again), and a verified floor replaces it.
//
// Only an event of a type the worker does not handle is a dead letter
// (workers.Permanent): it cannot be processed at all.
package join

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers"
)

// Name is the worker's name: outcomes are dev.steward.join.<outcome>.v1.
const Name = "join"

// Outcomes the worker emits.
const (
	OutcomeArmed         = "armed"
	OutcomeArmedAlready  = "armed-already"
	OutcomeRefused       = "refused"
	OutcomeSuperseded    = "superseded"
	OutcomeFloorAccepted = "floor-accepted"
	OutcomeFloorKept     = "floor-kept"
	OutcomeFloorRefused  = "floor-refused"
)

// ErrRefused marks every policy refusal: an event that verifies wrongly,
// names something that is not this box's, or is superseded. The handler
// emits the refusal's outcome first and returns the error wrapped in
// workers.Refused, so the runtime acknowledges and settles the event; it is
// never a dead letter, since no redelivery would be received differently.
var ErrRefused = errors.New("join refused")

// Config is the join worker's configuration (docs/design.md §6, join settings).
type Config struct {
	// Box is this box's name; the worker consumes only its invitations.
	Box string
	// Deployment the box joins; floors and invitations name it.
	Deployment string
	// ConsoleKey is the console's ed25519 public key set that signs
	// invitations: a PEM file holding one or more PUBLIC KEY blocks, or
	// several files separated by commas (signing.LoadEnvelopeKeys). A key
	// is rotated by adding the new one, signing with it, then removing
	// the old one; an invitation signed by any key of the set verifies.
	ConsoleKey string
	// ReleaseKey is the release ed25519 public key set that signs host
	// floors, given and rotated as ConsoleKey is.
	ReleaseKey string
	// IdentityRecord is the path of this box's published identity record
	// (JSON with at least box and instanceId); invitations carry its
	// SHA-256.
	IdentityRecord string
	// InstanceIDFile is a file holding this instance's ID. Exactly one of
	// it and InstanceIDURL is set.
	InstanceIDFile string
	// InstanceIDURL is a metadata URL answering this instance's ID to an
	// HTTP GET.
	InstanceIDURL string
	// OptDir is the absolute folder under which system/join/ is written.
	OptDir string
	// ArmCommand is the program that arms the guard; it is run without a
	// shell as: <cmd> -policy <path> -identity <path> -enrollment <path>.
	ArmCommand string
	// ArmedMarker is the file the arm command writes once armed; its
	// content is the enrollment JSON.
	ArmedMarker string
	// MaxClockSkew is how far an invitation's signed issuedAt may be ahead
	// of this box's clock (0: DefaultMaxClockSkew). Invitations are ordered
	// by issuedAt, so one from further ahead would supersede every later
	// invitation until its time came; it is refused instead.
	MaxClockSkew time.Duration
	// ArmTimeout bounds one run of the arm command (0: DefaultArmTimeout).
	// A run that takes longer is killed with its whole process group and
	// retried, so a hung guard never holds the box's invitations for ever.
	ArmTimeout time.Duration
}

// DefaultArmTimeout is how long the arm command may run: arming a guard is
// a local operation of seconds, and two minutes leaves room for a slow
// first start without letting a hung one hold the box.
const DefaultArmTimeout = 2 * time.Minute

// DefaultMaxClockSkew bounds how far ahead of this box's clock a signed
// issuedAt may be: clocks kept by NTP agree within seconds, and five
// minutes leaves room for one that drifted without opening a real window.
const DefaultMaxClockSkew = 5 * time.Minute

// orDefault is d, or def when d is zero (unset).
func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// AddFlags registers the settings as flags named like their STEWARD_*
// environment twins.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Box, "box", c.Box, "this box's name; only its invitations are consumed")
	fs.StringVar(&c.Deployment, "deployment", c.Deployment, "the deployment this box joins")
	fs.StringVar(&c.ConsoleKey, "console-key", c.ConsoleKey, "the console's ed25519 public keys (PEM) that sign invitations: one file with one or more PUBLIC KEY blocks, or files separated by commas; an invitation signed by any of them verifies, so a key is rotated by adding the new one, then removing the old")
	fs.StringVar(&c.ReleaseKey, "release-key", c.ReleaseKey, "the release ed25519 public keys (PEM) that sign host floors: one file with one or more PUBLIC KEY blocks, or files separated by commas; a floor signed by any of them verifies, so a key is rotated by adding the new one, then removing the old")
	fs.StringVar(&c.IdentityRecord, "identity-record", c.IdentityRecord, "path of this box's published identity record (JSON: box, instanceId)")
	fs.StringVar(&c.InstanceIDFile, "instance-id-file", c.InstanceIDFile, "file holding this instance's ID (or use --instance-id-url)")
	fs.StringVar(&c.InstanceIDURL, "instance-id-url", c.InstanceIDURL, "metadata URL answering this instance's ID over HTTP GET (or use --instance-id-file)")
	fs.StringVar(&c.OptDir, "opt-dir", c.OptDir, "absolute folder under which system/join/policy.json and enrollment.json are written")
	fs.StringVar(&c.ArmCommand, "arm-command", c.ArmCommand, "program run as <cmd> -policy P -identity I -enrollment E to arm the host guard")
	fs.StringVar(&c.ArmedMarker, "armed-marker", c.ArmedMarker, "file the arm command writes once the guard is armed")
	fs.DurationVar(&c.ArmTimeout, "arm-timeout", orDefault(c.ArmTimeout, DefaultArmTimeout), "how long one run of the arm command may take; a longer one is killed with its process group and retried")
	fs.DurationVar(&c.MaxClockSkew, "max-clock-skew", orDefault(c.MaxClockSkew, DefaultMaxClockSkew), "how far an invitation's signed issuedAt may be ahead of this box's clock; one further ahead is refused, since it would supersede every later invitation")
}

// Worker is the join worker of one box.
type Worker struct {
	cfg         Config
	consoleKeys *signing.KeySet
	releaseKeys *signing.KeySet
	armPath     string
	http        *http.Client
	// now is the box's clock, which an invitation's issuedAt is checked
	// against.
	now func() time.Time
}

// New checks cfg and loads the two public key sets.
func New(cfg Config) (*Worker, error) {
	if err := events.CheckKey(cfg.Box); err != nil {
		return nil, fmt.Errorf("--box: %w", err)
	}
	if err := events.CheckKey(cfg.Deployment); err != nil {
		return nil, fmt.Errorf("--deployment: %w", err)
	}
	consoleKeys, err := loadKeySet("--console-key", cfg.ConsoleKey)
	if err != nil {
		return nil, err
	}
	releaseKeys, err := loadKeySet("--release-key", cfg.ReleaseKey)
	if err != nil {
		return nil, err
	}
	if cfg.IdentityRecord == "" {
		return nil, errors.New("--identity-record: required: the path of this box's published identity record")
	}
	switch {
	case cfg.InstanceIDFile == "" && cfg.InstanceIDURL == "":
		return nil, errors.New("--instance-id-file or --instance-id-url: one is required, to read this instance's ID")
	case cfg.InstanceIDFile != "" && cfg.InstanceIDURL != "":
		return nil, errors.New("--instance-id-file and --instance-id-url: set one, not both, so the instance ID has one source")
	case cfg.InstanceIDURL != "":
		u, err := url.Parse(cfg.InstanceIDURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("--instance-id-url: %q must be an http or https URL with a host", cfg.InstanceIDURL)
		}
	}
	if cfg.OptDir == "" || !filepath.IsAbs(cfg.OptDir) {
		return nil, fmt.Errorf("--opt-dir: %q must be an absolute path, so the guard's files never depend on the working directory", cfg.OptDir)
	}
	cfg.OptDir = filepath.Clean(cfg.OptDir)
	if cfg.ArmCommand == "" {
		return nil, errors.New("--arm-command: required: the program that arms the host guard")
	}
	armPath, err := exec.LookPath(cfg.ArmCommand)
	if err != nil {
		return nil, fmt.Errorf("--arm-command: %q is not an executable program: %w", cfg.ArmCommand, err)
	}
	if cfg.ArmedMarker == "" {
		return nil, errors.New("--armed-marker: required: the file the arm command writes once armed")
	}
	if cfg.MaxClockSkew < 0 {
		return nil, fmt.Errorf("--max-clock-skew: %s is negative; it is how far ahead of this box's clock an invitation's issuedAt may be", cfg.MaxClockSkew)
	}
	cfg.MaxClockSkew = orDefault(cfg.MaxClockSkew, DefaultMaxClockSkew)
	if cfg.ArmTimeout < 0 {
		return nil, fmt.Errorf("--arm-timeout: %s is negative; it is how long one run of the arm command may take", cfg.ArmTimeout)
	}
	cfg.ArmTimeout = orDefault(cfg.ArmTimeout, DefaultArmTimeout)
	return &Worker{
		cfg:         cfg,
		consoleKeys: consoleKeys,
		releaseKeys: releaseKeys,
		armPath:     armPath,
		http:        &http.Client{Timeout: 5 * time.Second},
		now:         time.Now,
	}, nil
}

// loadKeySet reads the ed25519 key set a flag names: one PEM file with one
// or more PUBLIC KEY blocks, or several files separated by commas.
func loadKeySet(flag, spec string) (*signing.KeySet, error) {
	if strings.TrimSpace(spec) == "" {
		return nil, fmt.Errorf("%s: required: an ed25519 public key file (PEM PKIX) with one or more PUBLIC KEY blocks, or several files separated by commas", flag)
	}
	keys, err := signing.LoadEnvelopeKeys(spec)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return keys, nil
}

// Spec consumes this box's invitations and every host floor.
func (w *Worker) Spec() workers.Spec {
	s := SpecFor(w.cfg.Box)
	// The box's invitation and its deployment's floor are each the
	// current one: of several not yet applied, only the newest counts.
	s.Rank = w.rank
	return s
}

// SpecFor is the Spec of the worker of box without its Rank, which needs
// the console and release keys: what a dry run (steward replay --dry-run,
// which decodes and validates and handles nothing) reads the instance's
// subjects with.
func SpecFor(box string) workers.Spec {
	inv, _ := events.Lookup(events.TypeInvitationWritten)
	floor, _ := events.Lookup(events.TypeHostFloorPublished)
	return workers.Spec{
		Name:     Name,
		Instance: box,
		Subjects: []string{inv.FilterSubject(box), floor.FilterSubject("")},
		Types:    []string{events.TypeInvitationWritten, events.TypeHostFloorPublished},
		// A box already armed, or a floor already kept, changes nothing.
		Unchanged: []string{OutcomeArmedAlready, OutcomeFloorKept},
	}
}

// rank is an event's place in its key's order once it verifies: an
// invitation by its signed issuedAt, this deployment's floor by its signed
// minAgentVersion. Whatever does not verify (or is another deployment's
// floor, or a pre-release floor, which has no place in a plain number)
// ranks nowhere and is handled in its turn.
func (w *Worker) rank(_ context.Context, d *workers.Delivery) (uint64, error) {
	switch d.Event.Type() {
	case events.TypeInvitationWritten:
		var data events.InvitationWritten
		if err := d.DataAs(&data); err != nil {
			return 0, err
		}
		if data.Box != w.cfg.Box {
			return 0, workers.ErrUnranked
		}
		inv, rule, reason := w.verifyInvitation(data.Envelope)
		if rule != "" {
			return 0, fmt.Errorf("invitation %s does not verify [%s]: %s", d.Event.ID(), rule, reason)
		}
		at, err := time.Parse(time.RFC3339Nano, inv.IssuedAt)
		if err != nil || at.UnixNano() < 0 {
			return 0, workers.ErrUnranked
		}
		return uint64(at.UnixNano()), nil
	case events.TypeHostFloorPublished:
		var data events.HostFloorPublished
		if err := d.DataAs(&data); err != nil {
			return 0, err
		}
		if data.Deployment != w.cfg.Deployment {
			return 0, workers.ErrUnranked
		}
		floor, rule, reason := w.verifyFloor(data.Envelope)
		if rule != "" {
			return 0, fmt.Errorf("host floor %s does not verify [%s]: %s", d.Event.ID(), rule, reason)
		}
		v, err := events.ParseVersion(floor.MinAgentVersion)
		if err != nil || v.Prerelease() != "" || v.Major() >= 1<<20 || v.Minor() >= 1<<20 || v.Patch() >= 1<<20 {
			return 0, workers.ErrUnranked
		}
		return v.Major()<<40 | v.Minor()<<20 | v.Patch(), nil
	}
	return 0, workers.ErrUnranked
}

// Handle applies one invitation or host floor.
func (w *Worker) Handle(ctx context.Context, d *workers.Delivery) error {
	switch d.Event.Type() {
	case events.TypeInvitationWritten:
		return w.handleInvitation(ctx, d)
	case events.TypeHostFloorPublished:
		return w.handleFloor(ctx, d)
	}
	// Not a policy decision: the worker cannot process the event at all,
	// so it is a dead letter for an operator to look at.
	return workers.Permanent(fmt.Errorf("event %s (%s) has type %q, which the join worker does not handle; it was not applied", d.Event.ID(), d.Key, d.Event.Type()))
}

// Close releases nothing: the worker holds no connections of its own.
func (w *Worker) Close() error { return nil }

func joinDir(opt string) string { return filepath.Join(opt, "system", "join") }

// PolicyPath is where the worker writes the guard's policy for an opt dir.
func PolicyPath(optDir string) string { return filepath.Join(joinDir(optDir), "policy.json") }

// EnrollmentPath is where the worker writes the enrollment for an opt dir.
func EnrollmentPath(optDir string) string { return filepath.Join(joinDir(optDir), "enrollment.json") }

// Policy is <opt>/system/join/policy.json.
type Policy struct {
	Schema     int              `json:"schema"`
	Deployment string           `json:"deployment"`
	Mode       string           `json:"mode"`
	Floor      events.HostFloor `json:"floor"`
}

// Enrollment is <opt>/system/join/enrollment.json, and the content of the
// armed marker the arm command writes.
type Enrollment struct {
	Box        string `json:"box"`
	Enrollment string `json:"enrollment"`
	InstanceID string `json:"instanceId"`
}

// IdentityRecord is the part of a box's published identity record the
// worker reads.
type IdentityRecord struct {
	Box        string `json:"box"`
	InstanceID string `json:"instanceId"`
}
