package join

import (
	"context"
	"fmt"
	"regexp"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers"
)

// floorState is the name of the state document holding the kept floor.
const floorState = "floor"

// KeptFloor is the state document of the newest verified host floor. It
// holds the floor's DSSE envelope as received and nothing derived from it:
// whoever can write the checkpoint bucket can write this document, so it is
// a cache, never proof, and the worker verifies the envelope again with the
// release key every time it reads the document. A readable copy of the
// payload beside it would only be something to trust instead.
type KeptFloor struct {
	// Envelope is the floor as the release key signed it. A document
	// without one (as Steward wrote before floors were kept as evidence)
	// proves nothing and is refused like a forged one.
	Envelope *dsse.Envelope `json:"envelope,omitempty"`
	// EventID and Sequence say which event brought the floor, for people
	// reading the bucket; no decision rests on them.
	EventID  string `json:"eventId"`
	Sequence uint64 `json:"sequence"`
}

// keptFloor is what reading the kept floor found.
type keptFloor struct {
	// rev is the document's revision, 0 when no floor is kept.
	rev uint64
	// floor is the verified payload, set only when verified.
	floor    events.HostFloor
	verified bool
	// untrusted says, when a document is kept that does not verify, what
	// was found: it is neither a floor nor the absence of one.
	untrusted string
}

// ours reports whether a verified floor of this deployment is held.
func (k keptFloor) ours(deployment string) bool {
	return k.verified && k.floor.Deployment == deployment
}

// readKeptFloor reads the kept floor and verifies its envelope again. An
// error means the state could not be read (retried); a document that reads
// but does not verify is reported in untrusted.
func (w *Worker) readKeptFloor(ctx context.Context, d *workers.Delivery) (keptFloor, error) {
	var doc KeptFloor
	rev, err := d.State().Get(ctx, floorState, &doc)
	if err != nil {
		return keptFloor{}, fmt.Errorf("read the kept host floor of %s (event %s): %w", w.cfg.Box, d.Event.ID(), err)
	}
	k := keptFloor{rev: rev}
	switch {
	case rev == 0:
	case doc.Envelope == nil:
		k.untrusted = fmt.Sprintf("the kept host floor of box %s (state %q, revision %d) holds no signed envelope: Steward wrote such documents before it kept floors as evidence, and anyone who can write the checkpoint bucket can write one, so it proves nothing",
			w.cfg.Box, floorState, rev)
	default:
		// A kept floor of another deployment (the box was moved) is
		// still the release key's word, only not about this deployment.
		floor, rule, reason := w.openFloor(*doc.Envelope)
		if rule != "" {
			k.untrusted = fmt.Sprintf("the kept host floor of box %s (state %q, revision %d) does not verify [%s]: %s; it was not written by this worker from a signed floor",
				w.cfg.Box, floorState, rev, rule, reason)
			break
		}
		k.floor, k.verified = floor, true
	}
	return k, nil
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
// The kept floor is compared by its envelope, verified again, never by what
// the state document claims beside it.
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
	floor, rule, reason := w.verifyFloor(data.Envelope)
	if rule != "" {
		return w.refuseFloor(ctx, d, data.Deployment, rule, reason)
	}
	offered, _ := events.ParseVersion(floor.MinAgentVersion)

	kept, err := w.readKeptFloor(ctx, d)
	if err != nil {
		return err
	}
	accepted := map[string]string{"deployment": w.cfg.Deployment, "minAgentVersion": floor.MinAgentVersion}
	switch {
	case kept.untrusted != "":
		// Republishing the floor is how an operator recovers from a kept
		// floor that does not verify, so a verified floor replaces it
		// whatever its version: the document said nothing that can be
		// compared, and deleting it would have allowed the same.
		d.Log.Warn().Str("kept", kept.untrusted).Str("offered", floor.MinAgentVersion).
			Msg("the kept host floor does not verify; the verified floor offered replaces it")
		accepted["replaced"] = kept.untrusted
	case kept.ours(w.cfg.Deployment):
		cur, _ := events.ParseVersion(kept.floor.MinAgentVersion) // verified: a semantic version
		if !offered.GreaterThan(cur) {
			d.Log.Info().Str("offered", floor.MinAgentVersion).Str("kept", kept.floor.MinAgentVersion).
				Msg("host floor is not newer than the kept one; the kept floor stays")
			return d.Emit(ctx, OutcomeFloorKept, map[string]string{
				"deployment": w.cfg.Deployment, "minAgentVersion": floor.MinAgentVersion, "kept": kept.floor.MinAgentVersion,
			})
		}
	}
	env := data.Envelope
	next := KeptFloor{Envelope: &env, EventID: d.Event.ID(), Sequence: d.Sequence}
	if _, err := d.State().Put(ctx, floorState, next, kept.rev); err != nil {
		// A lost race is retried: the next delivery reads the winner and
		// decides again.
		return fmt.Errorf("keep host floor %s for %s (event %s): %w", floor.MinAgentVersion, d.Key, d.Event.ID(), err)
	}
	return d.Emit(ctx, OutcomeFloorAccepted, accepted)
}

// verifyFloor checks a floor envelope offered for this deployment; a
// non-empty rule names what failed.
func (w *Worker) verifyFloor(env dsse.Envelope) (events.HostFloor, string, string) {
	floor, rule, reason := w.openFloor(env)
	if rule == "" && floor.Deployment != w.cfg.Deployment {
		return floor, "deployment", fmt.Sprintf("its signed payload names deployment %q, not %q that the event is addressed to", floor.Deployment, w.cfg.Deployment)
	}
	return floor, rule, reason
}

// decodeFloor decodes a verified floor payload strictly (see decodeSigned)
// and checks its version.
func decodeFloor(payload []byte) (events.HostFloor, string, string) {
	var floor events.HostFloor
	if rule, reason := decodeSigned(payload, &floor, "host floor"); rule != "" {
		return events.HostFloor{}, rule, reason
	}
	if floor.V != 1 {
		return floor, "version", fmt.Sprintf("its payload has v %d; this worker reads v 1 floors only", floor.V)
	}
	return floor, "", ""
}

// openFloor verifies a floor envelope with the release key and checks its
// payload, whichever deployment it names; a non-empty rule names what
// failed.
func (w *Worker) openFloor(env dsse.Envelope) (events.HostFloor, string, string) {
	var floor events.HostFloor
	payload, _, err := w.releaseKeys.OpenEnvelope(env, events.PayloadTypeHostFloor)
	if err != nil {
		return floor, "signature", fmt.Sprintf("its envelope does not verify with the release key set --release-key (%v); publish a floor signed by a key of the set", err)
	}
	floor, rule, reason := decodeFloor(payload)
	if rule != "" {
		return floor, rule, reason
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

// refuseFloor reports a floor refused by the worker's rules: the outcome
// first, then workers.Refused, so the event is settled and the kept floor
// is left as it was.
func (w *Worker) refuseFloor(ctx context.Context, d *workers.Delivery, deployment, rule, reason string) error {
	if err := d.Emit(ctx, OutcomeFloorRefused, map[string]string{"deployment": deployment, "rule": rule, "reason": reason}); err != nil {
		return err
	}
	return workers.Refused(fmt.Errorf("%w: the host floor for deployment %s (event %s) is refused [%s]: %s; the floor kept before stays",
		ErrRefused, deployment, d.Event.ID(), rule, reason))
}
