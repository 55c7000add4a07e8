package join_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/bothways"
	"github.com/steward-dev/steward/workers/join"
	"github.com/steward-dev/steward/workers/workertest"
)

// TestStoriesBothWays runs each story of box-1 in deployment dep in memory
// and on the real runtime on an embedded server (issue 24): both must come
// to the story's verdicts, outcomes, dead letters, state documents and
// guard (armed marker, arm runs, policy), and to the same ones, outcome
// data and whole documents included. The
// invitation and the floor are latest-wins, each by its signed order
// (issuedAt, minAgentVersion).
func TestStoriesBothWays(t *testing.T) {
	const box = "box-1"
	keys := newFixture(t, box)
	_, stranger, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}

	// floorOf is a floor of deployment at version, signed by key.
	floorOf := func(version, what string, key ed25519.PrivateKey, deployment string) bothways.Step {
		data, err := join.SignHostFloor(key, events.HostFloor{V: 1, Deployment: deployment, MinAgentVersion: version, Binaries: []string{strings.Repeat("ab", 32)}})
		if err != nil {
			t.Fatal(err)
		}
		e, err := events.New(events.TypeHostFloorPublished, deployment, data)
		if err != nil {
			t.Fatal(err)
		}
		return bothways.Step{What: "hostfloor.published " + version + " for " + deployment + " (" + what + ")", Event: e}
	}
	// floor is the release key's floor of dep at version.
	floor := func(version string) bothways.Step {
		return floorOf(version, "signed", keys.release.(ed25519.PrivateKey), "dep")
	}
	invitationStep := func(what string, data events.InvitationWritten) bothways.Step {
		e, err := events.New(events.TypeInvitationWritten, data.Box, data)
		if err != nil {
			t.Fatal(err)
		}
		return bothways.Step{What: "invitation.written " + what + " for " + data.Box, Event: e}
	}
	// invitation is the console's invitation of box-1 for enrollment,
	// issued hours after the fixture's time.
	invitation := func(enrollment string, hours int) bothways.Step {
		inv := keys.invitation()
		inv.Enrollment = enrollment
		inv.IssuedAt = issued.Add(time.Duration(hours) * time.Hour).Format(time.RFC3339)
		return invitationStep(enrollment, keys.sign(inv))
	}
	byStranger, err := join.SignInvitation(stranger, keys.invitation())
	if err != nil {
		t.Fatal(err)
	}
	good := keys.sign(keys.invitation())
	raw := func(what, typ, key string, data map[string]any) bothways.Step {
		return bothways.Step{What: what, Event: bothways.Raw(t, typ, key, data)}
	}
	fields := func(box string, extra ...any) map[string]any {
		f := map[string]any{"box": box, "envelope": good.Envelope}
		for i := 0; i+1 < len(extra); i += 2 {
			f[extra[i].(string)] = extra[i+1]
		}
		return f
	}
	v := func(list ...workertest.Verdict) []workertest.Verdict { return list }
	// guard is the box's guard armed with enrollment ("": not armed) by
	// armRuns runs of the arm command, its policy holding floor.
	guard := func(enrollment string, armRuns int, floor string) map[string]any {
		return map[string]any{"guard": map[string]any{"armed": enrollment, "armRuns": armRuns, "policyFloor": floor}}
	}
	// kept is the state of a box that keeps the floor of the story's
	// event floorSeq and the invitation of its event invitationSeq (the
	// documents hold the signed envelope and which event brought it).
	kept := func(floorSeq, invitationSeq int) map[string]any {
		return map[string]any{
			"floor":      map[string]any{"sequence": floorSeq},
			"invitation": map[string]any{"sequence": invitationSeq},
		}
	}
	f100 := floor("1.0.0")

	stories := []bothways.Story{
		{
			Name:  "happy path: the floor, then the invitation arms the box",
			Steps: []bothways.Step{f100, invitation("enr-1", 0)},
			Want: bothways.Want{
				Verdicts: v(workertest.Applied, workertest.Applied),
				Outcomes: []string{"dep floor-accepted", "box-1 armed"},
				State:    kept(1, 2), Effects: guard("enr-1", 1, "1.0.0"),
			},
		},
		{
			Name:  "an invitation ahead of any floor is retried until the floor behind it is kept, then arms the box",
			Steps: []bothways.Step{invitation("enr-1", 0), floor("1.0.0")},
			Want: bothways.Want{
				Verdicts: v(workertest.Applied, workertest.Applied),
				Outcomes: []string{"box-1 armed", "dep floor-accepted"},
				State:    kept(2, 1), Effects: guard("enr-1", 1, "1.0.0"),
			},
			Right: bothways.OnRuntime,
		},
		{
			Name:  "the same invitation republished, queued together: the copy supersedes the first",
			Steps: []bothways.Step{floor("1.0.0"), invitation("enr-1", 0), invitation("enr-1", 0)},
			Want: bothways.Want{
				Verdicts: v(workertest.Applied, workertest.Superseded, workertest.Applied),
				Outcomes: []string{"dep floor-accepted", "box-1 superseded", "box-1 armed"},
				State:    kept(1, 3), Effects: guard("enr-1", 1, "1.0.0"),
			},
		},
		{
			Name:  "the same floor twice (one id): stored once",
			Steps: []bothways.Step{f100, f100},
			Want: bothways.Want{
				Verdicts: v(workertest.Applied, workertest.Applied),
				Outcomes: []string{"dep floor-accepted"},
				State:    map[string]any{"floor": map[string]any{"sequence": 1}}, Effects: guard("", 0, ""),
			},
			Right: bothways.OnRuntime,
		},
		{
			Name: "latest wins: the newer floor and the newer invitation supersede the older queued before them",
			Steps: []bothways.Step{
				floor("1.0.0"), floor("1.2.0"), floor("1.1.0"),
				invitation("enr-1", 0), invitation("enr-2", 1),
			},
			Want: bothways.Want{
				Verdicts: v(workertest.Superseded, workertest.Applied, workertest.Applied, workertest.Superseded, workertest.Applied),
				Outcomes: []string{"dep superseded", "dep floor-accepted", "dep floor-kept", "box-1 superseded", "box-1 armed"},
				State:    kept(2, 5), Effects: guard("enr-2", 1, "1.2.0"),
			},
		},
		{
			Name: "policy refusals: an invitation signed by another key, one whose payload was swapped under the signature",
			Steps: []bothways.Step{
				floor("1.0.0"),
				invitationStep("enr-1 (signed by another key)", byStranger),
				invitationStep("enr-1 (payload swapped)", swappedPayload(t, keys)),
				invitation("enr-1", 0),
			},
			Want: bothways.Want{
				Verdicts: v(workertest.Applied, workertest.Refused, workertest.Refused, workertest.Applied),
				Outcomes: []string{"dep floor-accepted", "box-1 refused", "box-1 refused", "box-1 armed"},
				State:    kept(1, 4), Effects: guard("enr-1", 1, "1.0.0"),
			},
		},
		{
			Name: "floors: another deployment's is acknowledged and not kept, one signed by another key is refused",
			Steps: []bothways.Step{
				floorOf("2.0.0", "signed", keys.release.(ed25519.PrivateKey), "dep-2"),
				floorOf("2.0.0", "signed by another key", stranger, "dep"),
				floor("1.0.0"),
			},
			Want: bothways.Want{
				Verdicts: v(workertest.Applied, workertest.Refused, workertest.Applied),
				Outcomes: []string{"dep floor-refused", "dep floor-accepted"},
				State:    map[string]any{"floor": map[string]any{"sequence": 3}}, Effects: guard("", 0, ""),
			},
		},
		{
			Name: "bad inputs go to the DLQ without reaching the handler",
			Steps: []bothways.Step{
				raw("a field the schema does not have", events.TypeInvitationWritten, box, fields(box, "grants", "root")),
				raw("a box with dots", events.TypeInvitationWritten, "box.1", fields("box.1")),
				raw("a box with '>'", events.TypeInvitationWritten, "box-1>", fields("box-1>")),
				raw("a type no worker handles", "dev.example.invitation.revoked.v1", box, fields(box)),
				raw("subject box-1, data naming box-2", events.TypeInvitationWritten, box, fields("box-2")),
			},
			Want: bothways.Want{
				Verdicts: v(workertest.DeadLettered, workertest.DeadLettered, workertest.DeadLettered, workertest.DeadLettered, workertest.DeadLettered),
				DeadLetters: []string{`"grants"`, "/box: does not match pattern", "/box: does not match pattern",
					"is not a Steward event type", `must equal the data's box "box-2"`},
				State: map[string]any{}, Effects: guard("", 0, ""),
			},
		},
	}
	for _, s := range stories {
		t.Run(s.Name, func(t *testing.T) {
			boxRunner(keys, false).Run(t, s)
		})
	}

	// Another box's invitation, published as that box's, is kept away by the
	// consumer's filter on the runtime; in memory workertest's Runner hands
	// it to the handler all the same (it does not apply Spec.Subjects), and
	// Replay on the runtime waits for it until its timeout fails the test,
	// so no story can tell it both ways today. A consumer misconfigured to
	// see every box shows the handler's own guard, both ways.
	other := newFixture(t, "box-2")
	other.console = keys.console
	t.Run("another box's invitation reaching a consumer that sees every box is refused", func(t *testing.T) {
		boxRunner(keys, true).Run(t, bothways.Story{
			Name:  "another box's invitation reaching a consumer that sees every box is refused",
			Steps: []bothways.Step{floor("1.0.0"), invitationStep("enr-1", other.sign(other.invitation()))},
			Want: bothways.Want{
				Verdicts: v(workertest.Applied, workertest.Refused),
				Outcomes: []string{"dep floor-accepted", "box-2 refused"},
				State:    map[string]any{"floor": map[string]any{"sequence": 1}}, Effects: guard("", 0, ""),
			},
		})
	})
}

// swappedPayload is a console-signed invitation whose payload was replaced
// by one naming another enrollment, under the same signature.
func swappedPayload(t *testing.T, f *fixture) events.InvitationWritten {
	t.Helper()
	d := f.sign(f.invitation())
	forged := f.invitation()
	forged.Enrollment = "enr-forged"
	d.Envelope.Payload = f.sign(forged).Envelope.Payload
	return d
}

// guard is what the worker did to the box, as an effect: the enrollment
// the armed marker holds, how often the arm command ran, and the floor the
// guard's policy holds ("" for what is not there).
func (f *fixture) guard(t *testing.T) map[string]any {
	t.Helper()
	var marker join.Enrollment
	var policy join.Policy
	for path, v := range map[string]any{f.cfg.ArmedMarker: &marker, join.PolicyPath(f.cfg.OptDir): &policy} {
		raw, err := os.ReadFile(path)
		if os.IsNotExist(err) {
			continue
		}
		if err == nil {
			err = json.Unmarshal(raw, v)
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	return map[string]any{"guard": map[string]any{"armed": marker.Enrollment, "armRuns": f.armRuns(), "policyFloor": policy.Floor.MinAgentVersion}}
}

// boxRunner makes a fresh join worker of keys' box for each run, with its
// own opt dir, identity record and arm command, and keys' console and
// release keys; a wide one consumes every box's invitations, as a
// misconfigured consumer would. The floor's lane and the invitation's run
// side by side on the runtime, so an invitation may find no floor kept yet
// and be retried: the runtime tries it again until it applies.
func boxRunner(keys *fixture, wide bool) bothways.Runner {
	return bothways.Runner{New: func(t *testing.T, _ bothways.Mode) bothways.Worker {
		f := newFixture(t, keys.cfg.Box)
		f.cfg.ConsoleKey, f.cfg.ReleaseKey = keys.cfg.ConsoleKey, keys.cfg.ReleaseKey
		w := f.worker()
		spec := w.Spec()
		if wide {
			spec.Instance = "wide"
			spec.Subjects = []string{"steward.events.invitation.written.>", spec.Subjects[1]}
		}
		return bothways.Worker{
			Spec: spec, Handler: w, Effects: f.guard,
			Runtime: fastRetries(),
			Options: []workertest.Option{workertest.WithAttempts(20)},
		}
	}}
}
