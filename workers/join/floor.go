package join

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers"
)

// floorState is the name of the state document holding the kept floor.
const floorState = "floor"

// KeptFloor is the state document of the newest verified host floor.
type KeptFloor struct {
	Floor    events.HostFloor `json:"floor"`
	EventID  string           `json:"eventId"`
	Sequence uint64           `json:"sequence"`
}

// binaryDigest is one entry of a floor's binaries: a SHA-256 in hex,
// optionally written with its algorithm.
var binaryDigest = regexp.MustCompile(`^(sha256:)?[0-9a-f]{64}$`)

// handleFloor keeps the newest verified floor of this deployment.
//
// "Newest" is decided by minAgentVersion (semver), not by stream order: the
// floor is signed content, and a replayed or republished older floor gets a
// later sequence, so ordering by sequence would let anyone who can publish
// roll the floor back with an old, validly signed envelope. A floor is
// identified by its version: an equal version does not replace the kept one.
func (w *Worker) handleFloor(ctx context.Context, d *workers.Delivery) error {
	var data events.HostFloorPublished
	if err := d.DataAs(&data); err != nil {
		return err
	}
	if data.Deployment != w.cfg.Deployment {
		// Every deployment's floors share one subject; another's is not
		// this box's business and no fault of the event.
		d.Log.Info().Str("deployment", data.Deployment).Str("our_deployment", w.cfg.Deployment).
			Msg("host floor for another deployment; acknowledged and not kept")
		return nil
	}
	floor, rule, reason := w.verifyFloor(data)
	if rule != "" {
		return w.refuseFloor(ctx, d, data.Deployment, rule, reason)
	}
	offered, _ := events.ParseVersion(floor.MinAgentVersion)

	var kept KeptFloor
	rev, err := d.State().Get(ctx, floorState, &kept)
	if err != nil {
		return fmt.Errorf("read the kept host floor for %s (event %s): %w", d.Key, d.Event.ID(), err)
	}
	if rev != 0 && kept.Floor.Deployment == w.cfg.Deployment {
		if cur, err := events.ParseVersion(kept.Floor.MinAgentVersion); err == nil && !offered.GreaterThan(cur) {
			d.Log.Info().Str("offered", floor.MinAgentVersion).Str("kept", kept.Floor.MinAgentVersion).
				Msg("host floor is not newer than the kept one; the kept floor stays")
			return d.Emit(ctx, OutcomeFloorKept, map[string]string{
				"deployment": w.cfg.Deployment, "minAgentVersion": floor.MinAgentVersion, "kept": kept.Floor.MinAgentVersion,
			})
		}
	}
	next := KeptFloor{Floor: floor, EventID: d.Event.ID(), Sequence: d.Sequence}
	if _, err := d.State().Put(ctx, floorState, next, rev); err != nil {
		// A lost race is retried: the next delivery reads the winner and
		// decides again.
		return fmt.Errorf("keep host floor %s for %s (event %s): %w", floor.MinAgentVersion, d.Key, d.Event.ID(), err)
	}
	return d.Emit(ctx, OutcomeFloorAccepted, map[string]string{
		"deployment": w.cfg.Deployment, "minAgentVersion": floor.MinAgentVersion,
	})
}

// verifyFloor checks a floor envelope; a non-empty rule names what failed.
func (w *Worker) verifyFloor(data events.HostFloorPublished) (events.HostFloor, string, string) {
	var floor events.HostFloor
	payload, err := signing.OpenEnvelope(w.releaseKey, data.Envelope, events.PayloadTypeHostFloor)
	if err != nil {
		return floor, "signature", fmt.Sprintf("its envelope does not verify with the release key %s (%v); publish a floor signed by the release key", w.cfg.ReleaseKey, err)
	}
	var head struct {
		V int `json:"v"`
	}
	if err := json.Unmarshal(payload, &head); err != nil {
		return floor, "payload", fmt.Sprintf("its signed payload is not JSON (%v)", err)
	}
	if head.V != 1 {
		return floor, "version", fmt.Sprintf("its payload has v %d; this worker reads v 1 floors only", head.V)
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&floor); err != nil {
		return floor, "payload", fmt.Sprintf("its signed payload is not a v 1 host floor (%v)", err)
	}
	if floor.Deployment != w.cfg.Deployment {
		return floor, "deployment", fmt.Sprintf("its signed payload names deployment %q, not %q that the event is addressed to", floor.Deployment, w.cfg.Deployment)
	}
	if _, err := events.ParseVersion(floor.MinAgentVersion); err != nil {
		return floor, "minAgentVersion", fmt.Sprintf("its minAgentVersion is not a semantic version (%v)", err)
	}
	for i, b := range floor.Binaries {
		if !binaryDigest.MatchString(b) {
			return floor, "binaries", fmt.Sprintf("binaries[%d] %.80q is not a SHA-256 in lowercase hex", i, b)
		}
	}
	return floor, "", ""
}

func (w *Worker) refuseFloor(ctx context.Context, d *workers.Delivery, deployment, rule, reason string) error {
	if err := d.Emit(ctx, OutcomeFloorRefused, map[string]string{"deployment": deployment, "rule": rule, "reason": reason}); err != nil {
		return err
	}
	return workers.Refused(fmt.Errorf("%w: the host floor for deployment %s (event %s) is refused [%s]: %s; the floor kept before stays",
		ErrRefused, deployment, d.Event.ID(), rule, reason))
}
