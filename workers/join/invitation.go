package join

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/atomicfile"
	"github.com/steward-dev/steward/internal/strictjson"
	"github.com/steward-dev/steward/workers"
)

// MaxEnrollment bounds an enrollment's length in bytes.
const MaxEnrollment = 128

// invitationState names the state document of the newest accepted
// invitation, which orders invitations by their signed issuedAt.
const invitationState = "invitation"

// ErrNoFloor says no verified host floor for the deployment is held yet.
// It is retried, never a refusal: a floor not yet seen is not a floor
// that says no.
var ErrNoFloor = errors.New("no verified host floor is held yet")

// acceptedInvitation is the state document of the newest invitation that
// passed every check. Like the kept floor it holds the signed envelope as
// received and nothing derived from it, and it is verified again with the
// console key whenever it is read: a forged document claiming a late
// issuedAt would otherwise make every real invitation look superseded.
type acceptedInvitation struct {
	// Envelope is the invitation as the console signed it. A document
	// without one (as Steward wrote before invitations were kept as
	// evidence) orders nothing and is refused like a forged one.
	Envelope *dsse.Envelope `json:"envelope,omitempty"`
	// EventID and Sequence say which event it was, for people reading
	// the bucket; no decision rests on them.
	EventID  string `json:"eventId"`
	Sequence uint64 `json:"sequence"`
}

// readAccepted reads the newest accepted invitation and verifies it again
// as an invitation for this box. rev is 0 when there is none; untrusted says
// what was found when a document is kept that does not verify; an error
// means the state could not be read (retried).
func (w *Worker) readAccepted(ctx context.Context, d *workers.Delivery) (inv events.Invitation, rev uint64, untrusted string, err error) {
	var doc acceptedInvitation
	rev, err = d.State().Get(ctx, invitationState, &doc)
	if err != nil {
		return inv, 0, "", fmt.Errorf("read the newest accepted invitation of %s (event %s): %w", w.cfg.Box, d.Event.ID(), err)
	}
	switch {
	case rev == 0:
	case doc.Envelope == nil:
		untrusted = fmt.Sprintf("the newest accepted invitation of box %s (state %q, revision %d) holds no signed envelope: Steward wrote such documents before it kept invitations as evidence, and anyone who can write the checkpoint bucket can write one, so it orders nothing",
			w.cfg.Box, invitationState, rev)
	default:
		var rule, reason string
		if inv, rule, reason = w.verifyInvitation(*doc.Envelope); rule != "" {
			untrusted = fmt.Sprintf("the newest accepted invitation of box %s (state %q, revision %d) is not a valid invitation for this box [%s]: %s; it was not written by this worker from an invitation it accepted",
				w.cfg.Box, invitationState, rev, rule, reason)
		}
	}
	return inv, rev, untrusted, nil
}

// recoverState is the command that removes an untrusted state document of
// this worker instance, so the next verified event writes it anew. It names
// the runtime's key layout (st.<worker>.<instance>.<name>).
func (w *Worker) recoverState(name string) string {
	return fmt.Sprintf("nats kv del %s %s", events.CheckpointBucket, events.StateKey(Name, w.cfg.Box, name))
}

// stepFilesWritten is the stage saved once policy.json and enrollment.json
// are durable: a redelivery of the same event goes straight to the arm
// command, without reading again the facts it already verified.
const stepFilesWritten = "files-written"

type armStage struct {
	Step       string `json:"step"`
	Enrollment string `json:"enrollment"`
	InstanceID string `json:"instanceId"`
}

// handleInvitation arms the guard for a verified invitation. The order of
// the checks is the contract's: the signature, v, the deployment, the box,
// the enrollment and issuedAt (which orders invitations, so it may not be
// ahead of this box's clock by more than MaxClockSkew); then already armed;
// the order of invitations; the identity record's SHA-256; its instance; a
// held floor. Nothing read from the payload is used before it verifies.
func (w *Worker) handleInvitation(ctx context.Context, d *workers.Delivery) error {
	var data events.InvitationWritten
	if err := d.DataAs(&data); err != nil {
		return err
	}
	if data.Box != w.cfg.Box {
		return w.refuse(ctx, d, data.Box, "addressed", fmt.Sprintf("the event is addressed to box %q, not this box %q (its consumer filter should never deliver it here)", data.Box, w.cfg.Box))
	}

	// Nothing the payload says is used before it verifies: not the
	// enrollment the armed check compares, not a saved stage.
	inv, rule, reason := w.verifyInvitation(data.Envelope)
	if rule != "" {
		return w.refuse(ctx, d, w.cfg.Box, rule, reason)
	}

	var st armStage
	resumed, err := d.LoadStage(&st)
	if err != nil {
		return err
	}
	// A stage is state too: it is used only for the enrollment this
	// event's verified invitation names; any other is started over.
	if resumed && st.Step == stepFilesWritten && st.Enrollment == inv.Enrollment {
		d.Log.Info().Str("enrollment", st.Enrollment).Msg("policy and enrollment were written by an earlier delivery; running the arm command")
		return w.arm(ctx, d, st)
	}

	// The armed check changes nothing and reports only what the marker, a
	// fact on this box, says about the verified enrollment.
	marker, exists, err := readEnrollmentFile(w.cfg.ArmedMarker)
	if err != nil {
		return fmt.Errorf("the armed marker of box %s (event %s): %w; retried, since an unreadable marker is not proof the box is unarmed", w.cfg.Box, d.Event.ID(), err)
	}
	if exists && marker.Box == w.cfg.Box && marker.Enrollment == inv.Enrollment {
		d.Log.Info().Str("enrollment", marker.Enrollment).Msg("box is already armed for this enrollment; nothing written")
		return d.Emit(ctx, OutcomeArmedAlready, map[string]string{"box": w.cfg.Box, "enrollment": marker.Enrollment})
	}

	acc, accRev, untrusted, err := w.readAccepted(ctx, d)
	if err != nil {
		return err
	}
	if untrusted != "" {
		return w.refuse(ctx, d, w.cfg.Box, "kept-invitation", untrusted+fmt.Sprintf(
			"; it is taken neither as the order of invitations nor as no order, so this invitation was not applied. Delete it (%s) and publish the box's newest invitation again",
			w.recoverState(invitationState)))
	}
	newer := accRev == 0 || issuedAfter(inv.IssuedAt, acc.IssuedAt)
	if accRev != 0 && acc.Enrollment != inv.Enrollment && !newer {
		d.Log.Info().Str("enrollment", inv.Enrollment).Str("accepted", acc.Enrollment).
			Msg("invitation is older than the one accepted; ignored")
		if err := d.Emit(ctx, OutcomeSuperseded, map[string]string{
			"box": w.cfg.Box, "enrollment": inv.Enrollment, "issuedAt": inv.IssuedAt,
			"accepted": acc.Enrollment, "acceptedIssuedAt": acc.IssuedAt,
		}); err != nil {
			return err
		}
		return workers.Refused(fmt.Errorf("%w: the invitation for box %s (event %s), enrollment %s issued at %s, is superseded by the accepted one for enrollment %s issued at %s; the guard stays as that one armed it",
			ErrRefused, w.cfg.Box, d.Event.ID(), inv.Enrollment, inv.IssuedAt, acc.Enrollment, acc.IssuedAt))
	}

	rec, sum, parseErr, err := readIdentity(w.cfg.IdentityRecord)
	if err != nil {
		return fmt.Errorf("box %s (event %s): %w; retried, since an unreadable record is not a mismatch", w.cfg.Box, d.Event.ID(), err)
	}
	if !strings.EqualFold(sum, inv.EvidenceSHA256) {
		return w.refuse(ctx, d, w.cfg.Box, "evidence", fmt.Sprintf("its evidenceSHA256 %.64q is not the SHA-256 %s of the identity record %s; the console must invite the record this box publishes now", inv.EvidenceSHA256, sum, w.cfg.IdentityRecord))
	}
	if parseErr != nil {
		return w.refuse(ctx, d, w.cfg.Box, "identity-record", fmt.Sprintf("%v; the invited record names no instance to check", parseErr))
	}
	if rec.Box != w.cfg.Box {
		return w.refuse(ctx, d, w.cfg.Box, "identity-box", fmt.Sprintf("the identity record %s names box %.70q, not this box %q", w.cfg.IdentityRecord, rec.Box, w.cfg.Box))
	}
	instance, err := instanceID(ctx, w.cfg, w.http)
	if err != nil {
		return fmt.Errorf("box %s (event %s): %w; retried, since an unread ID is not a mismatch", w.cfg.Box, d.Event.ID(), err)
	}
	if rec.InstanceID != instance {
		return w.refuse(ctx, d, w.cfg.Box, "instance", fmt.Sprintf("the identity record names instance %.70q but this instance is %q; the record belongs to another machine", rec.InstanceID, instance))
	}

	kept, err := w.readKeptFloor(ctx, d)
	if err != nil {
		return err
	}
	if kept.untrusted != "" {
		return w.refuse(ctx, d, w.cfg.Box, "kept-floor", kept.untrusted+fmt.Sprintf(
			"; it is taken neither as the floor of deployment %s nor as no floor. Republish the deployment's newest host floor (steward publish --type %s --data @<the release pipeline's signed floor>): a verified floor replaces it; then publish this invitation again",
			w.cfg.Deployment, events.TypeHostFloorPublished))
	}
	if !kept.ours(w.cfg.Deployment) {
		return fmt.Errorf("invitation for box %s (event %s): %w for deployment %s; retried until the release pipeline's floor arrives", w.cfg.Box, d.Event.ID(), ErrNoFloor, w.cfg.Deployment)
	}

	if newer {
		env := data.Envelope
		next := acceptedInvitation{Envelope: &env, EventID: d.Event.ID(), Sequence: d.Sequence}
		if _, err := d.State().Put(ctx, invitationState, next, accRev); err != nil {
			return fmt.Errorf("record the accepted invitation of %s (event %s): %w", w.cfg.Box, d.Event.ID(), err)
		}
	}

	st = armStage{Step: stepFilesWritten, Enrollment: inv.Enrollment, InstanceID: instance}
	if err := w.writeFiles(st, kept.floor); err != nil {
		return fmt.Errorf("box %s (event %s): %w", w.cfg.Box, d.Event.ID(), err)
	}
	if err := d.SaveStage(ctx, st); err != nil {
		return err
	}
	return w.arm(ctx, d, st)
}

// verifyInvitation checks the envelope and its payload against this box; a
// non-empty rule names the first check that failed.
func (w *Worker) verifyInvitation(env dsse.Envelope) (events.Invitation, string, string) {
	var inv events.Invitation
	payload, _, err := w.consoleKeys.OpenEnvelope(env, events.PayloadTypeInvitation)
	if err != nil {
		return inv, "signature", fmt.Sprintf("its envelope does not verify with the console key set --console-key (%v); only the console's signed invitations arm a box", err)
	}
	inv, rule, reason := decodeInvitation(payload)
	if rule != "" {
		return inv, rule, reason
	}
	if inv.Deployment != w.cfg.Deployment {
		return inv, "deployment", fmt.Sprintf("it invites the box into deployment %.70q, but this box joins %q", inv.Deployment, w.cfg.Deployment)
	}
	if inv.Box != w.cfg.Box {
		return inv, "box", fmt.Sprintf("its signed payload names box %.70q, not this box %q", inv.Box, w.cfg.Box)
	}
	if reason := checkEnrollment(inv.Enrollment); reason != "" {
		return inv, "enrollment", reason
	}
	at, err := time.Parse(time.RFC3339Nano, inv.IssuedAt)
	if err != nil {
		return inv, "issuedAt", fmt.Sprintf("its issuedAt %.40q is not an RFC 3339 time, so it cannot be ordered against other invitations", inv.IssuedAt)
	}
	// Invitations are ordered by issuedAt, so one signed with a time far
	// ahead would supersede every later invitation until that time came.
	now := w.now()
	if ahead := at.Sub(now); ahead > w.cfg.MaxClockSkew {
		return inv, "issuedAt", fmt.Sprintf("its issuedAt %s is %s ahead of this box's clock (%s), beyond the %s allowed (--max-clock-skew); an invitation from the future would supersede every later one, so the clock that signed it (or this box's) must be put right and the invitation issued again",
			inv.IssuedAt, ahead.Round(time.Second), now.UTC().Format(time.RFC3339), w.cfg.MaxClockSkew)
	}
	return inv, "", ""
}

// decodeInvitation decodes a verified invitation payload strictly (see
// decodeSigned) and checks its version.
func decodeInvitation(payload []byte) (events.Invitation, string, string) {
	var inv events.Invitation
	if rule, reason := decodeSigned(payload, &inv, "invitation"); rule != "" {
		return events.Invitation{}, rule, reason
	}
	if inv.V != 1 {
		return inv, "version", fmt.Sprintf("its payload has v %d; this worker reads v 1 invitations only", inv.V)
	}
	return inv, "", ""
}

// decodeSigned decodes a verified payload into v as a reviewer reads it:
// encoding/json alone matches keys case-insensitively and lets the last of
// two equal keys win, so the payload a person checks with jq ("enrollment")
// and the one the worker acts on ("Enrollment", later) could differ under
// one valid signature. strictjson refuses duplicate keys, keys that are not
// the exact name of a field, and unknown keys. kind names the document in
// the reason.
func decodeSigned(payload []byte, v any, kind string) (rule, reason string) {
	if !json.Valid(payload) {
		var probe any
		err := json.Unmarshal(payload, &probe)
		return "payload", fmt.Sprintf("its signed payload is not JSON (%v)", err)
	}
	if err := strictjson.Decode(payload, v); err != nil {
		return "payload", fmt.Sprintf("its signed payload is not a v 1 %s (%v)", kind, err)
	}
	return "", ""
}

// checkEnrollment refuses an enrollment that could do harm where it ends up
// (JSON, a command's view of its files, logs): empty, over-long, control
// characters, path separators, "..", a leading '-' or '.'. It returns why,
// or "" for a safe one.
func checkEnrollment(e string) string {
	switch {
	case e == "":
		return "its enrollment is empty; the console must name the enrollment it grants"
	case len(e) > MaxEnrollment:
		return fmt.Sprintf("its enrollment is %d bytes long, over the %d an enrollment may hold", len(e), MaxEnrollment)
	case !utf8.ValidString(e) || strings.IndexFunc(e, unicode.IsControl) >= 0:
		return fmt.Sprintf("its enrollment %.40q holds a control character or invalid UTF-8", e)
	case strings.ContainsAny(e, `/\`):
		return fmt.Sprintf("its enrollment %.40q holds a path separator, which could lead outside the opt dir", e)
	case strings.Contains(e, ".."):
		return fmt.Sprintf("its enrollment %.40q holds \"..\", which could lead outside the opt dir", e)
	case !isAlnum(rune(e[0])):
		return fmt.Sprintf("its enrollment %.40q starts with %q; an enrollment starts with a letter or digit, so it is never read as an option or a hidden file", e, e[0])
	}
	for _, r := range e {
		if !isAlnum(r) && !strings.ContainsRune("._:-", r) {
			return fmt.Sprintf("its enrollment %.40q holds %q; an enrollment is letters, digits, '.', '_', ':' and '-'", e, r)
		}
	}
	return ""
}

func isAlnum(r rune) bool {
	return (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9')
}

// issuedAfter reports whether a is strictly later than b (both RFC 3339).
func issuedAfter(a, b string) bool {
	ta, errA := time.Parse(time.RFC3339Nano, a)
	tb, errB := time.Parse(time.RFC3339Nano, b)
	if errA != nil {
		return false
	}
	if errB != nil {
		return true
	}
	return ta.After(tb)
}

// writeFiles writes enrollment.json, then policy.json, durably. The
// enrollment goes first so that a crash between the two leaves a box that
// `steward join status` calls invited, never a policy without its
// enrollment.
func (w *Worker) writeFiles(st armStage, floor events.HostFloor) error {
	dir := joinDir(w.cfg.OptDir)
	if fi, err := os.Lstat(dir); err == nil && !fi.IsDir() {
		return fmt.Errorf("%s is not a folder (%s); remove it so the guard's files are written where expected", dir, fi.Mode().Type())
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("inspect %s: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	// MkdirAll leaves an existing folder's mode alone and cuts a new one's
	// by the umask; the guard's folder is exactly 0700 either way.
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("make %s 0700: %w", dir, err)
	}
	for _, p := range []string{filepath.Dir(dir), w.cfg.OptDir} {
		if err := atomicfile.SyncDir(p); err != nil {
			return err
		}
	}
	enr, err := json.MarshalIndent(Enrollment{Box: w.cfg.Box, Enrollment: st.Enrollment, InstanceID: st.InstanceID}, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(EnrollmentPath(w.cfg.OptDir), append(enr, '\n'), 0o600); err != nil {
		return err
	}
	pol, err := json.MarshalIndent(Policy{Schema: 1, Deployment: w.cfg.Deployment, Mode: "armed", Floor: floor}, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(PolicyPath(w.cfg.OptDir), append(pol, '\n'), 0o600)
}

// arm runs the arm command, within ArmTimeout, and, once the marker names
// this box and enrollment, reports join.armed. Every failure, a timeout
// included, is retried.
func (w *Worker) arm(ctx context.Context, d *workers.Delivery, st armStage) error {
	// A hung arm command would hold this box's invitations for ever, so a
	// run gets ArmTimeout. It runs in a process group of its own and the
	// whole group is killed at the end: a script's children would
	// otherwise outlive it and keep its output open.
	actx, cancel := context.WithTimeout(ctx, w.cfg.ArmTimeout)
	defer cancel()
	cmd := exec.CommandContext(actx, w.armPath,
		"-policy", PolicyPath(w.cfg.OptDir),
		"-identity", w.cfg.IdentityRecord,
		"-enrollment", EnrollmentPath(w.cfg.OptDir))
	killGroupOnCancel(cmd)
	out := &tail{max: 1024}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	if err := cmd.Run(); err != nil {
		if errors.Is(actx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
			return fmt.Errorf("arm command %s for box %s, enrollment %s (event %s) did not finish within the --arm-timeout of %s, so its process group was killed (%w: %v); output: %q; retried with the files already written",
				w.cfg.ArmCommand, w.cfg.Box, st.Enrollment, d.Event.ID(), w.cfg.ArmTimeout, actx.Err(), err, out.String())
		}
		return fmt.Errorf("arm command %s for box %s, enrollment %s (event %s): %w; output: %q; retried with the files already written",
			w.cfg.ArmCommand, w.cfg.Box, st.Enrollment, d.Event.ID(), err, out.String())
	}
	marker, exists, err := readEnrollmentFile(w.cfg.ArmedMarker)
	switch {
	case err != nil:
		return fmt.Errorf("arm command %s for box %s (event %s) succeeded, but %w; retried", w.cfg.ArmCommand, w.cfg.Box, d.Event.ID(), err)
	case !exists || marker.Box != w.cfg.Box || marker.Enrollment != st.Enrollment:
		return fmt.Errorf("arm command %s for box %s (event %s) succeeded, but the armed marker %s does not name box %s and enrollment %s (found box %q, enrollment %.70q); retried",
			w.cfg.ArmCommand, w.cfg.Box, d.Event.ID(), w.cfg.ArmedMarker, w.cfg.Box, st.Enrollment, marker.Box, marker.Enrollment)
	}
	d.Log.Info().Str("enrollment", st.Enrollment).Dur("arm_duration", time.Since(start)).Msg("host guard armed")
	return d.Emit(ctx, OutcomeArmed, map[string]string{"box": w.cfg.Box, "enrollment": st.Enrollment, "deployment": w.cfg.Deployment})
}

// refuse reports an invitation refused by the worker's rules: the outcome
// first, then workers.Refused, so the event is settled (never a dead letter)
// and nothing on the box changes.
func (w *Worker) refuse(ctx context.Context, d *workers.Delivery, box, rule, reason string) error {
	if err := d.Emit(ctx, OutcomeRefused, map[string]string{"box": box, "rule": rule, "reason": reason}); err != nil {
		return err
	}
	return workers.Refused(fmt.Errorf("%w: the invitation for box %s (event %s) is refused [%s]: %s; the guard was not armed",
		ErrRefused, box, d.Event.ID(), rule, reason))
}

// tail keeps the last max bytes written to it: enough of a failing
// command's output to say why, never an unbounded buffer.
type tail struct {
	max int
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = t.buf[len(t.buf)-t.max:]
	}
	return len(p), nil
}

func (t *tail) String() string { return strings.TrimSpace(string(t.buf)) }
