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
package credential

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/agekey"
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
}

// Skipped is the data of credential.skipped: the event's version is not
// above the one the files already hold.
type Skipped struct {
	Hive    string `json:"hive"`
	Version uint64 `json:"version"`
	Applied uint64 `json:"applied"`
}

// Refused is the data of credential.refused: no retry can apply the event,
// and the files were left as they were.
type Refused struct {
	Hive    string `json:"hive"`
	Version uint64 `json:"version"`
	Reason  string `json:"reason"`
}

// Config is a credential worker's configuration (DESIGN §6: STEWARD_HIVE,
// STEWARD_AGE_IDENTITY, STEWARD_CREDENTIAL_DIR).
type Config struct {
	// Hive is the hive this instance serves; it is also the instance name.
	Hive string
	// AgeIdentity is the hive's age identity file, as age-keygen writes it.
	AgeIdentity string
	// CredentialDir is where secret and client_id are published. It must
	// exist (it is often a mount): a missing one is retried, not created.
	CredentialDir string
}

// AddFlags registers --hive, --age-identity and --credential-dir.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Hive, "hive", c.Hive, "the hive whose credential this worker applies")
	fs.StringVar(&c.AgeIdentity, "age-identity", c.AgeIdentity, "the hive's age identity file (as age-keygen writes it); rotated secrets are encrypted to its recipient")
	fs.StringVar(&c.CredentialDir, "credential-dir", c.CredentialDir, "the folder where secret (0600) and client_id (0644) are published; it must exist")
}

// Worker applies credential.rotated events for one hive.
type Worker struct {
	hive string
	dir  string
	id   *agekey.Identity
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
	return &Worker{hive: cfg.Hive, dir: dir, id: id}, nil
}

// Spec consumes the hive's own credential.rotated subject.
func (w *Worker) Spec() workers.Spec {
	return workers.Spec{
		Name:     Name,
		Instance: w.hive,
		Subjects: []string{events.EventsPrefix + ".credential.rotated." + w.hive},
		Types:    []string{events.TypeCredentialRotated},
	}
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
// handler's error (Permanent for a refusal, plain for a retry).
type result struct {
	outcome string
	data    any
	err     error
}

// Handle applies one credential.rotated event.
func (w *Worker) Handle(ctx context.Context, d *workers.Delivery) error {
	var data events.CredentialRotated
	if err := d.DataAs(&data); err != nil {
		return err
	}
	var st stage
	if _, err := d.LoadStage(&st); err != nil {
		return err
	}
	save := func(folder string) error { return d.SaveStage(ctx, stage{Folder: folder}) }
	res := w.rotate(data, d.Event.ID(), st.Folder, save, d.Log)
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

// rotate is the handler's decision and its effect on the files, apart from
// the bus: savedFolder is the stage an earlier delivery saved, save records
// the new folder before the swap.
func (w *Worker) rotate(data events.CredentialRotated, eventID, savedFolder string, save func(folder string) error, log zerolog.Logger) result {
	log = log.With().Str("hive", data.Hive).Uint64("version", data.Version).Logger()
	where := fmt.Sprintf("hive %s, event %s", data.Hive, eventID)
	refuse := func(reason string) result {
		log.Warn().Str("reason", reason).Msg("credential rotation refused")
		return result{
			outcome: OutcomeRefused,
			data:    Refused{Hive: data.Hive, Version: data.Version, Reason: reason},
			err:     workers.Permanent(fmt.Errorf("%s: %s", where, reason)),
		}
	}
	retry := func(err error) result {
		err = fmt.Errorf("%s: version %d not applied, retrying: %w", where, data.Version, err)
		log.Error().Str("error", err.Error()).Msg("credential rotation failed; it is retried")
		return result{err: err}
	}

	if data.Hive != w.hive {
		return refuse(fmt.Sprintf("version %d is for hive %q, but this worker serves hive %q; nothing was written", data.Version, data.Hive, w.hive))
	}

	unlock, err := lockDir(w.dir)
	if err != nil {
		return retry(err)
	}
	defer unlock()
	cur, err := readApplied(w.dir)
	if err != nil {
		return retry(err)
	}

	if savedFolder != "" && cur.folder == savedFolder {
		// An earlier delivery of this event swapped its folder in and did
		// not finish; finish and report it.
		return w.finish(data, cur.folder, "", retry, log)
	}
	if data.Version <= cur.version {
		if cur.version > 0 {
			// A crash after the swap may have left the stable links
			// missing; any later event puts them back.
			if err := ensureLinks(w.dir); err != nil {
				return retry(err)
			}
		}
		log.Info().Uint64("applied", cur.version).Msg("credential rotation is not newer than the applied one; skipped")
		return result{outcome: OutcomeSkipped, data: Skipped{Hive: data.Hive, Version: data.Version, Applied: cur.version}}
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

	folder, err := writeVersion(w.dir, data.Version, data.ClientID, secret)
	if err != nil {
		return retry(err)
	}
	if err := save(folder); err != nil {
		os.RemoveAll(filepath.Join(w.dir, folder))
		return retry(err)
	}
	if renamed, err := swap(w.dir, folder); err != nil {
		if !renamed {
			// The old pair is still current; the new folder is nobody's.
			os.RemoveAll(filepath.Join(w.dir, folder))
		}
		return retry(err)
	}
	return w.finish(data, folder, cur.folder, retry, log)
}

// finish puts the stable links in place and removes old version folders
// once folder is what ..data points to.
func (w *Worker) finish(data events.CredentialRotated, folder, previous string, retry func(error) result, log zerolog.Logger) result {
	if err := ensureLinks(w.dir); err != nil {
		return retry(err)
	}
	if err := cleanup(w.dir, folder, previous); err != nil {
		log.Warn().Str("error", err.Error()).Msg("old credential versions not removed; the next rotation tries again")
	}
	log.Info().Str("client_id", data.ClientID).Msg("credential applied")
	return result{outcome: OutcomeApplied, data: Applied{Hive: data.Hive, Version: data.Version, ClientID: data.ClientID}}
}
