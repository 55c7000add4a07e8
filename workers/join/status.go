package join

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/steward-dev/steward/events"
)

// Stage is how far a box has come in joining its deployment.
type Stage string

// The stages, in order, and the answer when a fact cannot be read.
const (
	StageNoInvitation   Stage = "no invitation"
	StageInvited        Stage = "invited"
	StageGuardInstalled Stage = "guard installed"
	StageArmed          Stage = "armed"
	StageUnknown        Stage = "unknown"
)

// Report is what `steward join status` prints.
type Report struct {
	Box        string
	Deployment string
	Stage      Stage
	// Enrollment is the one enrollment.json names, when it was read.
	Enrollment string
	// Reason says why the stage is what it is; for StageUnknown, which
	// fact could not be read and why.
	Reason string
	// Facts lists each fact read and what it said, in the order read.
	Facts []string
}

// String renders the report for a terminal.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "box %s (deployment %s): %s\n", r.Box, r.Deployment, r.Stage)
	if r.Enrollment != "" {
		fmt.Fprintf(&b, "  enrollment: %s\n", r.Enrollment)
	}
	fmt.Fprintf(&b, "  why: %s\n", r.Reason)
	for _, f := range r.Facts {
		fmt.Fprintf(&b, "  - %s\n", f)
	}
	return b.String()
}

// Status reports this box's stage from the facts on the box, each stage
// needing every fact of the one before it, so no single file's presence
// decides it:
//
//   - no invitation: enrollment.json is absent, or it does not match the
//     box (it names another box, or an instance other than the one the
//     identity record names, or the record names an instance other than
//     this one: an enrollment left from another machine).
//   - invited: enrollment.json names this box and the identity record's
//     instance, and that is this instance's ID.
//   - guard installed: invited, and policy.json is a schema 1 policy in
//     mode "armed" for this deployment, holding a floor of the same
//     deployment with a semantic minAgentVersion.
//   - armed: guard installed, and the armed marker names this box and the
//     enrollment of enrollment.json.
//   - unknown: a fact needed to decide could not be read (a file that
//     exists but cannot be read or parsed, an identity record that cannot
//     be read, an instance ID source that does not answer). The reason says
//     which, and how far the facts read so far go.
func Status(ctx context.Context, cfg Config) Report {
	r := Report{Box: cfg.Box, Deployment: cfg.Deployment}
	unknown := func(reason string) Report {
		r.Stage, r.Reason = StageUnknown, reason
		return r
	}
	if cfg.OptDir == "" {
		return unknown("--opt-dir is not set, so the guard's files cannot be found")
	}
	if cfg.IdentityRecord == "" {
		return unknown("--identity-record is not set, so the enrollment cannot be matched to this box")
	}

	enrPath := EnrollmentPath(cfg.OptDir)
	enr, exists, err := readEnrollmentFile(enrPath)
	if err != nil {
		return unknown(err.Error())
	}
	if !exists {
		r.Stage, r.Reason = StageNoInvitation, enrPath+" is absent: no invitation has been accepted on this box"
		return r
	}
	r.Enrollment = enr.Enrollment
	r.Facts = append(r.Facts, fmt.Sprintf("%s: box %q, enrollment %q, instance %q", enrPath, enr.Box, enr.Enrollment, enr.InstanceID))

	rec, _, parseErr, err := readIdentity(cfg.IdentityRecord)
	if err != nil {
		return unknown(err.Error() + "; enrollment.json exists but cannot be matched")
	}
	if parseErr != nil {
		return unknown(parseErr.Error() + "; enrollment.json exists but cannot be matched")
	}
	r.Facts = append(r.Facts, fmt.Sprintf("identity record %s: box %q, instance %q", cfg.IdentityRecord, rec.Box, rec.InstanceID))

	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	id, err := instanceID(ictx, cfg, &http.Client{Timeout: 5 * time.Second})
	cancel()
	if err != nil {
		return unknown(err.Error() + "; enrollment.json exists but cannot be matched to this instance")
	}
	r.Facts = append(r.Facts, fmt.Sprintf("this instance: %q", id))

	switch {
	case enr.Box != cfg.Box:
		r.Stage, r.Reason = StageNoInvitation, fmt.Sprintf("enrollment.json names box %q, not this box %q", enr.Box, cfg.Box)
		return r
	case enr.Box != rec.Box || enr.InstanceID != rec.InstanceID:
		r.Stage, r.Reason = StageNoInvitation, fmt.Sprintf("enrollment.json (box %q, instance %q) does not match the identity record (box %q, instance %q)", enr.Box, enr.InstanceID, rec.Box, rec.InstanceID)
		return r
	case rec.InstanceID != id:
		r.Stage, r.Reason = StageNoInvitation, fmt.Sprintf("the identity record and enrollment.json name instance %q, but this instance is %q", rec.InstanceID, id)
		return r
	case checkEnrollment(enr.Enrollment) != "":
		r.Stage, r.Reason = StageNoInvitation, "enrollment.json: "+checkEnrollment(enr.Enrollment)
		return r
	}

	polPath := PolicyPath(cfg.OptDir)
	pol, exists, err := readPolicy(polPath)
	if err != nil {
		return unknown(err.Error() + "; the box is at least invited")
	}
	if !exists {
		r.Stage, r.Reason = StageInvited, polPath+" is absent: the guard's policy is not installed yet"
		return r
	}
	r.Facts = append(r.Facts, fmt.Sprintf("%s: schema %d, deployment %q, mode %q, floor %q for %q", polPath, pol.Schema, pol.Deployment, pol.Mode, pol.Floor.MinAgentVersion, pol.Floor.Deployment))
	if why := policyInconsistency(pol, cfg.Deployment); why != "" {
		r.Stage, r.Reason = StageInvited, "policy.json is not consistent: "+why
		return r
	}

	marker, exists, err := readEnrollmentFile(cfg.ArmedMarker)
	switch {
	case cfg.ArmedMarker == "":
		return unknown("--armed-marker is not set; the guard is at least installed")
	case err != nil:
		return unknown("the armed marker " + err.Error() + "; the guard is at least installed")
	case !exists:
		r.Stage, r.Reason = StageGuardInstalled, "the armed marker "+cfg.ArmedMarker+" is absent: the arm command has not armed the guard"
		return r
	}
	r.Facts = append(r.Facts, fmt.Sprintf("armed marker %s: box %q, enrollment %q, instance %q", cfg.ArmedMarker, marker.Box, marker.Enrollment, marker.InstanceID))
	if marker.Box != cfg.Box || marker.Enrollment != enr.Enrollment {
		r.Stage, r.Reason = StageGuardInstalled, fmt.Sprintf("the armed marker names box %q and enrollment %q, not this box's enrollment %q", marker.Box, marker.Enrollment, enr.Enrollment)
		return r
	}
	r.Stage, r.Reason = StageArmed, fmt.Sprintf("the armed marker names box %q and enrollment %q", marker.Box, marker.Enrollment)
	return r
}

func policyInconsistency(p Policy, deployment string) string {
	switch {
	case p.Schema != 1:
		return fmt.Sprintf("schema %d, not 1", p.Schema)
	case p.Mode != "armed":
		return fmt.Sprintf("mode %q, not \"armed\"", p.Mode)
	case deployment != "" && p.Deployment != deployment:
		return fmt.Sprintf("deployment %q, not this box's %q", p.Deployment, deployment)
	case p.Floor.Deployment != p.Deployment:
		return fmt.Sprintf("its floor is for deployment %q, not %q", p.Floor.Deployment, p.Deployment)
	}
	if _, err := events.ParseVersion(p.Floor.MinAgentVersion); err != nil {
		return "its floor's minAgentVersion: " + err.Error()
	}
	return ""
}
