package join_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers/join"
)

// TestStatus walks a box through every stage by writing the facts one by
// one, then breaks each fact in turn.
func TestStatus(t *testing.T) {
	f := newFixture(t, "box-s")
	ctx := context.Background()
	cfg := f.cfg
	enrPath, polPath := join.EnrollmentPath(cfg.OptDir), join.PolicyPath(cfg.OptDir)
	writeJSON := func(path string, v any) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		raw, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, raw, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(step string, want join.Stage, reason string) join.Report {
		t.Helper()
		rep := join.Status(ctx, cfg)
		if rep.Stage != want || !strings.Contains(rep.Reason, reason) {
			t.Fatalf("%s: got %s, want stage %q with a reason saying %q", step, rep, want, reason)
		}
		if !strings.Contains(rep.String(), "box box-s (deployment dep): "+string(want)) {
			t.Fatalf("%s: String() = %q", step, rep.String())
		}
		return rep
	}
	enrollment := join.Enrollment{Box: "box-s", Enrollment: "enr-1", InstanceID: "i-box-s"}
	policy := join.Policy{Schema: 1, Deployment: "dep", Mode: "armed", Floor: events.HostFloor{V: 1, Deployment: "dep", MinAgentVersion: "1.0.0"}}

	expect("nothing written", join.StageNoInvitation, "is absent: no invitation")

	// An armed marker alone is one file's presence, not a stage.
	writeJSON(cfg.ArmedMarker, enrollment)
	expect("a marker alone", join.StageNoInvitation, "is absent")

	writeJSON(enrPath, join.Enrollment{Box: "box-s", Enrollment: "enr-1", InstanceID: "i-old-machine"})
	expect("enrollment of another instance", join.StageNoInvitation, `does not match the identity record`)
	writeJSON(enrPath, join.Enrollment{Box: "box-9", Enrollment: "enr-1", InstanceID: "i-box-s"})
	expect("enrollment of another box", join.StageNoInvitation, `names box "box-9", not this box`)
	f.write("instance-id", "i-new\n", 0o644)
	writeJSON(enrPath, enrollment)
	expect("record of another instance", join.StageNoInvitation, `but this instance is "i-new"`)
	f.write("instance-id", "i-box-s\n", 0o644)

	// A policy alone, with the enrollment removed, is not a stage either.
	os.Remove(enrPath)
	writeJSON(polPath, policy)
	expect("a policy alone", join.StageNoInvitation, "is absent")
	os.Remove(polPath)
	os.Remove(cfg.ArmedMarker)

	writeJSON(enrPath, enrollment)
	rep := expect("enrollment written", join.StageInvited, "policy.json is absent")
	if rep.Enrollment != "enr-1" || len(rep.Facts) != 3 {
		t.Fatalf("report %+v", rep)
	}

	audit := policy
	audit.Mode = "audit"
	writeJSON(polPath, audit)
	expect("policy in another mode", join.StageInvited, `not consistent: mode "audit"`)
	prod := policy
	prod.Deployment, prod.Floor.Deployment = "prod", "prod"
	writeJSON(polPath, prod)
	expect("policy of another deployment", join.StageInvited, `deployment "prod", not this box's "dep"`)
	writeJSON(polPath, policy)
	expect("policy written", join.StageGuardInstalled, "armed marker "+cfg.ArmedMarker+" is absent")

	writeJSON(cfg.ArmedMarker, join.Enrollment{Box: "box-s", Enrollment: "enr-0", InstanceID: "i-box-s"})
	expect("marker of an older enrollment", join.StageGuardInstalled, `names box "box-s" and enrollment "enr-0", not this box's enrollment "enr-1"`)
	writeJSON(cfg.ArmedMarker, enrollment)
	rep = expect("armed", join.StageArmed, `names box "box-s" and enrollment "enr-1"`)
	if len(rep.Facts) != 5 {
		t.Fatalf("facts %v", rep.Facts)
	}

	// Each fact that cannot be read makes the stage unknown, with why.
	os.Remove(cfg.ArmedMarker)
	if err := os.Mkdir(cfg.ArmedMarker, 0o700); err != nil {
		t.Fatal(err)
	}
	expect("marker unreadable", join.StageUnknown, "cannot be read")
	os.Remove(cfg.ArmedMarker)
	f.write("armed.json", "armed!", 0o644)
	expect("marker not JSON", join.StageUnknown, "is not an enrollment document")
	writeJSON(cfg.ArmedMarker, enrollment)

	if err := os.WriteFile(polPath, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	expect("policy not JSON", join.StageUnknown, "is not a guard policy")
	writeJSON(polPath, policy)

	os.Rename(cfg.IdentityRecord, cfg.IdentityRecord+".away")
	expect("record missing", join.StageUnknown, "the identity record "+cfg.IdentityRecord+" cannot be read")
	os.Rename(cfg.IdentityRecord+".away", cfg.IdentityRecord)

	if err := os.WriteFile(enrPath, []byte("enr-1"), 0o600); err != nil {
		t.Fatal(err)
	}
	expect("enrollment not JSON", join.StageUnknown, "is not an enrollment document")
	writeJSON(enrPath, enrollment)

	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	cfg.InstanceIDFile, cfg.InstanceIDURL = "", down.URL
	expect("metadata server down", join.StageUnknown, "this instance's ID cannot be read from "+down.URL)
	answers := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { rw.Write([]byte("i-box-s\n")) }))
	defer answers.Close()
	cfg.InstanceIDURL = answers.URL
	expect("metadata server answers", join.StageArmed, "names box")

	cfg.OptDir = ""
	expect("no opt dir", join.StageUnknown, "--opt-dir is not set")
}
