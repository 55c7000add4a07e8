// Package credential is the credential worker: it applies a hive's rotated
// queue credential (an OIDC client secret and its client id) to the files the
// hive's agents read, both or neither.
//
// The secret arrives encrypted with age to the hive's X25519 recipient and
// only the hive's identity opens it. The pair is published the way
// Kubernetes updates a secret volume: both files go into a new version
// folder, which is fsynced, and one symlink (..data) is renamed over the old
// one. The stable paths <dir>/secret (0600) and <dir>/client_id (0644) are
// links into ..data, so each open sees a complete file of one version.
//
// A reader that opens the two stable paths one after the other can still
// straddle a rotation (client_id of version N, secret of N+1) if the swap
// falls between its two opens; no writer can prevent that. A reader that
// needs a matched pair either resolves ..data once and reads both files in
// that folder (starting over if the folder is gone: the one replaced is kept
// for one more rotation, not for ever), or reads client_id, then secret,
// then client_id again and starts over when the two client ids differ
// (versions only move forward, so equal client ids prove the secret between
// them is theirs).
//
// The credential folder is the worker's: a missing one is made 0755 with
// its missing parents, as install -d does, walking from / without following
// a link in its place. Whoever can write it decides the pair, so it must be
// owned by the worker's user and not writable by group or others without
// the sticky bit, and ..data is believed only as the worker's own link to
// the worker's own version folder; anything else is loud and retried, never
// taken for "nothing applied" or for a newer version.
//
// An optional --on-change command runs once per applied version after the
// pair is in place (see Worker.announce); its failure is reported and
// counted and never rolls the pair back.
//
// A rotation counts only when the controller signed it (docs/design.md §7): the
// hive's recipient is public, so an unsigned rotation, or one whose
// envelope does not verify with a key of --controller-key, names another
// hive or disagrees with the event's fields, is refused before anything is
// read from it, and ranks nowhere, so it supersedes nothing. A hive pinned
// by a signed mistake (a version far above the controller's) is reset by
// removing <credential-dir>/..data: the applied version is read from that
// link alone, so the next signed rotation of any version applies.
package credential

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/agekey"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers"
)

// Name is the worker's name in subjects, consumers and outcome types.
const Name = "credential"

// Outcomes the worker emits (dev.steward.credential.<outcome>.v1).
const (
	OutcomeApplied = "applied"
	OutcomeSkipped = "skipped"
	OutcomeRefused = "refused"
)

// Applied is the data of credential.applied. It never holds the secret.
type Applied struct {
	Hive     string `json:"hive"`
	Version  uint64 `json:"version"`
	ClientID string `json:"clientId"`
	// OnChange is what the --on-change command did for this version; nil
	// when none is configured.
	OnChange *OnChange `json:"onChange,omitempty"`
}

// Skipped is the data of credential.skipped: the event's version is not
// above the one the files already hold. It is the refusal of a stale
// version: the handler returns workers.Refused after emitting it.
type Skipped struct {
	Hive    string `json:"hive"`
	Version uint64 `json:"version"`
	Applied uint64 `json:"applied"`
}

// Refused is the data of credential.refused: no retry can apply the event,
// and the files were left as they were. The handler returns
// workers.Refused after emitting it, so the event is settled, never a dead
// letter.
type Refused struct {
	Hive    string `json:"hive"`
	Version uint64 `json:"version"`
	// Rule names the signature rule broken (signing.RuleUnsigned, ...)
	// when the rotation was refused as not the controller's; empty for
	// the other refusals.
	Rule   string `json:"rule,omitempty"`
	Reason string `json:"reason"`
}

// Config is a credential worker's configuration (docs/design.md §6: STEWARD_HIVE,
// STEWARD_AGE_IDENTITY, STEWARD_CREDENTIAL_DIR; issue 14 adds
// STEWARD_ON_CHANGE and STEWARD_ON_CHANGE_TIMEOUT; issue 12
// STEWARD_CONTROLLER_KEY).
type Config struct {
	// Hive is the hive this instance serves; it is also the instance name.
	Hive string
	// ControllerKey is the controller's ed25519 public key set that signs
	// rotations: a PEM file holding one or more PUBLIC KEY blocks, or
	// several files separated by commas (signing.LoadEnvelopeKeys). A key
	// is rotated by adding the new one, signing with it, then removing
	// the old one.
	ControllerKey string
	// AgeIdentity is the hive's age identity file, as age-keygen writes it.
	AgeIdentity string
	// CredentialDir is where secret and client_id are published. A missing
	// one (and its missing parents) is created 0755, as install -d does; it
	// must be a real folder owned by the worker's user and not writable by
	// group or others without the sticky bit, or rotations are retried.
	CredentialDir string
	// OnChange is a command run with /bin/sh -c once a new pair is in place
	// (Vault Agent's and consul-template's template command). Empty: none.
	OnChange string
	// OnChangeTimeout bounds OnChange; its process group is killed then.
	// Zero is DefaultOnChangeTimeout.
	OnChangeTimeout time.Duration
}

// DefaultOnChangeTimeout is how long the --on-change command may run.
const DefaultOnChangeTimeout = 30 * time.Second

// AddFlags registers --hive, --age-identity, --credential-dir, --on-change
// and --on-change-timeout.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	if c.OnChangeTimeout == 0 {
		c.OnChangeTimeout = DefaultOnChangeTimeout
	}
	fs.StringVar(&c.Hive, "hive", c.Hive, "the hive whose credential this worker applies")
	fs.StringVar(&c.ControllerKey, "controller-key", c.ControllerKey, "the controller's ed25519 public keys (PEM) that sign rotations: one file with one or more PUBLIC KEY blocks, or files separated by commas; an unsigned rotation is refused")
	fs.StringVar(&c.AgeIdentity, "age-identity", c.AgeIdentity, "the hive's age identity file (as age-keygen writes it); rotated secrets are encrypted to its recipient")
	fs.StringVar(&c.CredentialDir, "credential-dir", c.CredentialDir, "the folder where secret (0600) and client_id (0644) are published; created 0755 with its parents when missing (as install -d); it must be owned by the worker's user and not writable by group or others unless sticky")
	fs.StringVar(&c.OnChange, "on-change", c.OnChange, "a command run with /bin/sh -c once per applied version, after the new pair is in place (STEWARD_HIVE, STEWARD_CREDENTIAL_VERSION, STEWARD_CREDENTIAL_DIR and STEWARD_CREDENTIAL_DATA in its environment, never the secret); its failure is reported and counted and never rolls the pair back")
	fs.DurationVar(&c.OnChangeTimeout, "on-change-timeout", c.OnChangeTimeout, "how long the --on-change command may run before its process group is killed")
}

// Worker applies credential.rotated events for one hive.
type Worker struct {
	hive string
	dir  string
	id   *agekey.Identity
	// keys are the controller keys a rotation must be signed by.
	keys *signing.KeySet
	// onChange and onChangeTimeout are Config's OnChange and its bound.
	onChange        string
	onChangeTimeout time.Duration
}

// New checks cfg and loads the hive's identity, so a worker with a key it
// cannot use fails at start rather than refusing every rotation.
func New(cfg Config) (*Worker, error) {
	if cfg.Hive == "" {
		return nil, errors.New("--hive is required: the hive whose credential this worker applies")
	}
	if err := events.CheckKey(cfg.Hive); err != nil {
		return nil, fmt.Errorf("--hive: %w", err)
	}
	if cfg.AgeIdentity == "" {
		return nil, errors.New("--age-identity is required: the hive's age identity file (steward keys makes one)")
	}
	if cfg.CredentialDir == "" {
		return nil, errors.New("--credential-dir is required: the folder where secret and client_id are published")
	}
	id, err := agekey.Load(cfg.AgeIdentity)
	if err != nil {
		return nil, fmt.Errorf("--age-identity: %w", err)
	}
	dir, err := filepath.Abs(cfg.CredentialDir)
	if err != nil {
		return nil, fmt.Errorf("--credential-dir %q: %w", cfg.CredentialDir, err)
	}
	if strings.TrimSpace(cfg.ControllerKey) == "" {
		return nil, errors.New("--controller-key is required: the controller's ed25519 public key (PEM) that signs rotations (steward keys --kind controller makes a pair); the hive's recipient is public, so an unsigned rotation proves nothing")
	}
	keys, err := signing.LoadEnvelopeKeys(cfg.ControllerKey)
	if err != nil {
		return nil, fmt.Errorf("--controller-key: %w", err)
	}
	timeout := cfg.OnChangeTimeout
	switch {
	case timeout == 0:
		timeout = DefaultOnChangeTimeout
	case timeout < 0:
		return nil, fmt.Errorf("--on-change-timeout %v: it must be positive", timeout)
	}
	if strings.TrimSpace(cfg.OnChange) != "" {
		registerMetrics()
	}
	return &Worker{hive: cfg.Hive, dir: dir, id: id, keys: keys, onChange: strings.TrimSpace(cfg.OnChange), onChangeTimeout: timeout}, nil
}

// Spec consumes the hive's own credential.rotated subject.
func (w *Worker) Spec() workers.Spec {
	s := SpecFor(w.hive)
	// A rotation is the hive's whole current credential: of several not
	// yet applied, only the newest version matters.
	s.Rank = w.rank
	return s
}

// SpecFor is the Spec of the worker of hive without its Rank, which needs
// the controller keys and the hive's identity: what a dry run (steward
// replay --dry-run, which decodes and validates and handles nothing) reads
// the instance's subjects with.
func SpecFor(hive string) workers.Spec {
	return workers.Spec{
		Name:     Name,
		Instance: hive,
		Subjects: []string{events.EventsPrefix + ".credential.rotated." + hive},
		Types:    []string{events.TypeCredentialRotated},
		// A rotation at or below the installed version changes nothing.
		Unchanged: []string{OutcomeSkipped},
	}
}

// rank is a rotation's place in the hive's order, its version, once it
// passes what Handle refuses by (this hive, the controller's signature
// binding every field, both fields, a secret that opens with the hive's
// identity and is not blank); a rotation that fails ranks nowhere, so a
// forged or unsigned huge version supersedes nothing.
func (w *Worker) rank(_ context.Context, d *workers.Delivery) (uint64, error) {
	var data events.CredentialRotated
	if err := d.DataAs(&data); err != nil {
		return 0, err
	}
	if data.Hive != w.hive || strings.TrimSpace(data.ClientID) == "" || strings.TrimSpace(data.Secret) == "" {
		return 0, fmt.Errorf("rotation %s for hive %s is not one Handle would apply", d.Event.ID(), data.Hive)
	}
	if _, err := signing.OpenRotation(w.keys, data); err != nil {
		return 0, fmt.Errorf("rotation %s (version %d) for hive %s ranks nowhere: %w", d.Event.ID(), data.Version, data.Hive, err)
	}
	secret, err := w.open(data.Version, data.Secret)
	if err != nil {
		return 0, err
	}
	defer clear(secret)
	if len(bytes.TrimSpace(secret)) == 0 {
		return 0, fmt.Errorf("rotation %s for hive %s has a blank secret", d.Event.ID(), data.Hive)
	}
	return data.Version, nil
}

// Close releases nothing: the worker holds no open resources between events.
func (w *Worker) Close() error { return nil }

// stage is saved before the swap; it names the folder this event wrote, so
// a redelivery after a crash (or a failed emit) that finds ..data pointing
// there knows the pair is this event's and reports it applied.
type stage struct {
	Folder string `json:"folder"`
}

// result is what handling one event decided: an outcome to report and the
// handler's error (Refused for a refusal, plain for a retry). folder is the
// version folder ..data names once the event's pair is applied.
type result struct {
	outcome string
	data    any
	err     error
	folder  string
}

// Handle applies one credential.rotated event. It returns nil once the
// pair is in place and reported, workers.Refused after reporting a policy
// refusal (another hive, an empty field, a secret it cannot open, a stale
// version), and a plain error, retried, for anything a person can fix (the
// folder, a leftover in the way, the bus).
func (w *Worker) Handle(ctx context.Context, d *workers.Delivery) error {
	var data events.CredentialRotated
	if err := d.DataAs(&data); err != nil {
		return err
	}
	res := w.apply(ctx, d, data)
	if res.outcome == OutcomeApplied && w.onChange != "" {
		// After rotate, so the folder lock is not held while the command
		// runs: the pair is in place whatever the command does.
		if err := w.announce(ctx, d, data, &res); err != nil {
			return err
		}
	}
	if res.outcome != "" {
		if err := d.Emit(ctx, res.outcome, res.data); err != nil {
			// Retried: a refusal or skip is decided the same way again,
			// and an applied pair is recognised by its saved folder.
			d.Log.Error().Str("error", err.Error()).Msg("outcome not emitted; the event is retried")
			return fmt.Errorf("hive %s, event %s: %w", data.Hive, d.Event.ID(), err)
		}
	}
	return res.err
}

// apply is the handler's decision and its effect on the files: the
// outcome is left to Handle, so that --on-change runs between the two. The
// stage an earlier delivery saved names the folder it swapped in.
func (w *Worker) apply(ctx context.Context, d *workers.Delivery, data events.CredentialRotated) result {
	log := d.Log.With().Str("hive", data.Hive).Uint64("version", data.Version).Logger()
	where := fmt.Sprintf("hive %s, event %s", data.Hive, d.Event.ID())
	refuseRule := func(rule, reason string) result {
		log.Warn().Str("rule", rule).Str("reason", reason).Msg("credential rotation refused")
		return result{
			outcome: OutcomeRefused,
			data:    Refused{Hive: data.Hive, Version: data.Version, Rule: rule, Reason: reason},
			err:     workers.Refused(fmt.Errorf("%s: %s", where, reason)),
		}
	}
	refuse := func(reason string) result { return refuseRule("", reason) }
	retry := func(err error) result {
		err = fmt.Errorf("%s: version %d not applied, retrying: %w", where, data.Version, err)
		log.Error().Str("error", err.Error()).Msg("credential rotation failed; it is retried")
		return result{err: err}
	}

	var saved stage
	if _, err := d.LoadStage(&saved); err != nil {
		return retry(err)
	}
	savedFolder := saved.Folder

	if data.Hive != w.hive {
		return refuse(fmt.Sprintf("version %d is for hive %q, but this worker serves hive %q; nothing was written", data.Version, data.Hive, w.hive))
	}
	// Nothing the event says counts before the controller's signature
	// over all of it verifies: not its version against the applied one,
	// not its secret.
	if _, err := signing.OpenRotation(w.keys, data); err != nil {
		var se *signing.StateError
		rule := signing.RuleSignature
		if errors.As(err, &se) {
			rule = se.Rule
		}
		return refuseRule(rule, notSigned(data, w.hive, err))
	}

	fo, err := openFolder(w.dir)
	if err != nil {
		return retry(err)
	}
	defer fo.close()
	for _, made := range fo.created {
		log.Info().Str("folder", made).Msg("credential folder created (0755, as install -d)")
	}
	cur, err := readApplied(fo)
	if err != nil {
		return retry(err)
	}

	if savedFolder != "" && cur.folder == savedFolder {
		// An earlier delivery of this event swapped its folder in and did
		// not finish; finish and report it.
		return w.finish(fo, data, cur.folder, "", retry, log)
	}
	if data.Version <= cur.version {
		if cur.version > 0 {
			// A crash after the swap may have left the stable links
			// missing; any later event puts them back.
			if err := ensureLinks(fo); err != nil {
				return retry(err)
			}
		}
		reason := fmt.Sprintf("version %d is not above the applied version %d, so the files were left as they were", data.Version, cur.version)
		log.Info().Uint64("applied", cur.version).Msg("credential rotation is not newer than the applied one; skipped")
		return result{
			outcome: OutcomeSkipped,
			data:    Skipped{Hive: data.Hive, Version: data.Version, Applied: cur.version},
			err:     workers.Refused(fmt.Errorf("%s: %s", where, reason)),
		}
	}

	kept := fmt.Sprintf("the files were left as they were (version %d); publish a corrected rotation with a version above %d", cur.version, cur.version)
	if strings.TrimSpace(data.ClientID) == "" {
		return refuse(fmt.Sprintf("version %d has an empty client id, and a secret without its client id never connects; %s", data.Version, kept))
	}
	if strings.TrimSpace(data.Secret) == "" {
		return refuse(fmt.Sprintf("version %d has an empty secret; %s", data.Version, kept))
	}
	secret, err := w.open(data.Version, data.Secret)
	if err != nil {
		return refuse(fmt.Sprintf("%v; %s", err, kept))
	}
	defer clear(secret)
	if len(bytes.TrimSpace(secret)) == 0 {
		return refuse(fmt.Sprintf("the secret of version %d is empty once decrypted (nothing but whitespace); %s", data.Version, kept))
	}

	folder, err := writeVersion(fo, data.Version, data.ClientID, secret)
	if err != nil {
		return retry(err)
	}
	if err := d.SaveStage(ctx, stage{Folder: folder}); err != nil {
		fo.root.RemoveAll(folder)
		return retry(err)
	}
	if renamed, err := swap(fo, folder); err != nil {
		if !renamed {
			// The old pair is still current; the new folder is nobody's.
			fo.root.RemoveAll(folder)
		}
		return retry(err)
	}
	return w.finish(fo, data, folder, cur.folder, retry, log)
}

// notSigned is the reason a rotation is refused as not the controller's:
// what was found, and that its version counts for nothing.
func notSigned(data events.CredentialRotated, hive string, err error) string {
	what := "is not signed by the controller"
	var se *signing.StateError
	if errors.As(err, &se) && se.Rule != signing.RuleUnsigned {
		what = "is not accepted as the controller's [" + se.Rule + "]"
	}
	return fmt.Sprintf("rotation %d for hive %s %s (%v), so nothing was written and its version counts for nothing; republish it signed with a key of --controller-key (steward publish --signing-key)",
		data.Version, hive, what, err)
}

// finish puts the stable links in place and removes old version folders
// once folder is what ..data points to.
func (w *Worker) finish(fo *folder, data events.CredentialRotated, folder, previous string, retry func(error) result, log zerolog.Logger) result {
	if err := ensureLinks(fo); err != nil {
		return retry(err)
	}
	if err := cleanup(fo, folder, previous); err != nil {
		log.Warn().Str("error", err.Error()).Msg("old credential versions not removed; the next rotation tries again")
	}
	log.Info().Str("client_id", data.ClientID).Msg("credential applied")
	return result{outcome: OutcomeApplied, data: Applied{Hive: data.Hive, Version: data.Version, ClientID: data.ClientID}, folder: folder}
}
