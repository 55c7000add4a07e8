package join_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/join"
	"github.com/steward-dev/steward/workers/replay"
	"github.com/steward-dev/steward/workers/workertest"
)

// signRaw signs any payload bytes as an invitation envelope, for payloads
// SignInvitation would never make.
func (f *fixture) signRaw(payload string) events.InvitationWritten {
	f.t.Helper()
	env, err := signing.SignEnvelope(f.console, events.PayloadTypeInvitation, []byte(payload))
	if err != nil {
		f.t.Fatal(err)
	}
	return events.InvitationWritten{Box: f.cfg.Box, Envelope: env}
}

// TestInvitationRefusals sends one bad invitation per rule, each checked in
// the contract's order, and shows each is refused once with its own
// message, as a settled refusal (its outcome, no dead letter), and that
// nothing reaches the opt dir or the arm command.
func TestInvitationRefusals(t *testing.T) {
	cases := []struct {
		name  string
		setup func(f *fixture)
		data  func(f *fixture) events.InvitationWritten
		rule  string
		msg   string
	}{
		{
			name: "signed by another key", rule: "signature", msg: "does not verify with the console key",
			data: func(f *fixture) events.InvitationWritten {
				_, other, _ := ed25519.GenerateKey(rand.Reader)
				d, err := join.SignInvitation(other, f.invitation())
				if err != nil {
					t.Fatal(err)
				}
				return d
			},
		},
		{
			name: "payload swapped under a valid signature", rule: "signature", msg: "does not verify with the console key",
			data: func(f *fixture) events.InvitationWritten {
				d := f.sign(f.invitation())
				forged := f.invitation()
				forged.Enrollment = "enr-forged"
				raw, _ := json.Marshal(forged)
				d.Envelope.Payload = base64.StdEncoding.EncodeToString(raw)
				return d
			},
		},
		{
			name: "payload not JSON", rule: "payload", msg: "its signed payload is not JSON",
			data: func(f *fixture) events.InvitationWritten { return f.signRaw("enroll me") },
		},
		{
			name: "v 2", rule: "version", msg: "its payload has v 2; this worker reads v 1 invitations only",
			data: func(f *fixture) events.InvitationWritten {
				inv := f.invitation()
				inv.V = 2
				return f.sign(inv)
			},
		},
		{
			name: "unknown payload field", rule: "payload", msg: "is not a v 1 invitation",
			data: func(f *fixture) events.InvitationWritten {
				inv := f.invitation()
				return f.signRaw(fmt.Sprintf(`{"v":1,"deployment":"dep","box":%q,"enrollment":"enr-1","evidenceSHA256":%q,"issuedAt":%q,"grants":"root"}`, inv.Box, inv.EvidenceSHA256, inv.IssuedAt))
			},
		},
		{
			// jq shows enrollment enr-1; encoding/json alone would arm
			// enr-evil, the later case twin, under the same signature.
			name: "case twin of a field", rule: "payload", msg: `key "Enrollment" in $ is not a field of the document`,
			data: func(f *fixture) events.InvitationWritten {
				inv := f.invitation()
				return f.signRaw(fmt.Sprintf(`{"v":1,"deployment":"dep","box":%q,"enrollment":"enr-1","evidenceSHA256":%q,"issuedAt":%q,"Enrollment":"enr-evil"}`, inv.Box, inv.EvidenceSHA256, inv.IssuedAt))
			},
		},
		{
			name: "duplicate key", rule: "payload", msg: `key "enrollment" appears twice`,
			data: func(f *fixture) events.InvitationWritten {
				inv := f.invitation()
				return f.signRaw(fmt.Sprintf(`{"v":1,"deployment":"dep","box":%q,"enrollment":"enr-1","evidenceSHA256":%q,"issuedAt":%q,"enrollment":"enr-evil"}`, inv.Box, inv.EvidenceSHA256, inv.IssuedAt))
			},
		},
		{
			name: "another deployment", rule: "deployment", msg: `it invites the box into deployment "prod", but this box joins "dep"`,
			data: func(f *fixture) events.InvitationWritten {
				inv := f.invitation()
				inv.Deployment = "prod"
				return f.sign(inv)
			},
		},
		{
			name: "another box in the payload", rule: "box", msg: `its signed payload names box "box-9", not this box`,
			data: func(f *fixture) events.InvitationWritten {
				inv := f.invitation()
				inv.Box = "box-9"
				d := f.sign(inv)
				d.Box = f.cfg.Box
				return d
			},
		},
		{
			name: "empty enrollment", rule: "enrollment", msg: "its enrollment is empty",
			data: func(f *fixture) events.InvitationWritten {
				inv := f.invitation()
				inv.Enrollment = ""
				return f.sign(inv)
			},
		},
		{
			name: "issuedAt not a time", rule: "issuedAt", msg: "is not an RFC 3339 time",
			data: func(f *fixture) events.InvitationWritten {
				inv := f.invitation()
				inv.IssuedAt = "last tuesday"
				return f.sign(inv)
			},
		},
		{
			name: "evidence of another record", rule: "evidence", msg: "is not the SHA-256",
			data: func(f *fixture) events.InvitationWritten {
				inv := f.invitation()
				sum := sha256.Sum256([]byte(`{"box":"box-x","instanceId":"i-stolen"}`))
				inv.EvidenceSHA256 = hex.EncodeToString(sum[:])
				return f.sign(inv)
			},
		},
		{
			name: "identity record not JSON", rule: "identity-record", msg: "is not JSON",
			setup: func(f *fixture) { f.write("identity.json", "box-x i-box-x\n", 0o644) },
			data:  func(f *fixture) events.InvitationWritten { return f.sign(f.invitation()) },
		},
		{
			// A reviewer reads instance i-elsewhere; encoding/json alone
			// would read the later case twin, this box's instance.
			name: "identity record with a case twin", rule: "instance", msg: `the identity record names instance "i-elsewhere"`,
			setup: func(f *fixture) {
				f.write("identity.json", `{"box":"box-x","instanceId":"i-elsewhere","InstanceId":"i-box-x"}`, 0o644)
			},
			data: func(f *fixture) events.InvitationWritten { return f.sign(f.invitation()) },
		},
		{
			name: "identity record with a key twice", rule: "identity-record", msg: `key "instanceId" appears twice`,
			setup: func(f *fixture) {
				f.write("identity.json", `{"box":"box-x","instanceId":"i-elsewhere","instanceId":"i-box-x"}`, 0o644)
			},
			data: func(f *fixture) events.InvitationWritten { return f.sign(f.invitation()) },
		},
		{
			name: "identity record of another box", rule: "identity-box", msg: `names box "box-7", not this box`,
			setup: func(f *fixture) {
				f.writeJSON("identity.json", join.IdentityRecord{Box: "box-7", InstanceID: "i-box-x"})
			},
			data: func(f *fixture) events.InvitationWritten { return f.sign(f.invitation()) },
		},
		{
			name: "record of another instance", rule: "instance", msg: `but this instance is "i-elsewhere"; the record belongs to another machine`,
			setup: func(f *fixture) { f.write("instance-id", "i-elsewhere\n", 0o644) },
			data:  func(f *fixture) events.InvitationWritten { return f.sign(f.invitation()) },
		},
	}
	seen := map[string]string{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := workertest.StartServer(t)
			js := srv.JetStream(t)
			f := newFixture(t, "box-x")
			if c.setup != nil {
				c.setup(f)
			}
			h, r := f.startRecording(js)
			f.publishFloor(js, f.floor("1.0.0"))
			waitOutcomes(t, js, "box-x", join.OutcomeFloorAccepted, 1)

			ack := f.publishInvitation(js, c.data(f))
			waitOutcomes(t, js, "box-x", join.OutcomeRefused, 1)
			workertest.WaitIdle(t, js, r.ConsumerName())

			// A refusal is settled with its outcome, never a dead letter.
			assertNoDeadLetters(t, js, "box-x")
			assertRefused(t, h, ack, "box-x", "["+c.rule+"]", c.msg, "the guard was not armed")
			refused := outcomes(t, js, "box-x", join.OutcomeRefused)
			if len(refused) != 1 || refused[0]["rule"] != c.rule || refused[0]["box"] != "box-x" || !strings.Contains(refused[0]["reason"], c.msg) {
				t.Errorf("refused outcomes %v, want one with rule %s", refused, c.rule)
			}
			if got := outcomes(t, js, "box-x", join.OutcomeArmed); len(got) != 0 {
				t.Errorf("armed outcomes %v after a refusal", got)
			}
			f.assertOptEmpty()
			if n := f.armRuns(); n != 0 {
				t.Errorf("the arm command ran %d times after a refusal", n)
			}
			msg := refused[0]["reason"]
			if prev, ok := seen[msg]; ok {
				t.Errorf("the refusal message %q is the same as case %q's", msg, prev)
			}
			seen[msg] = c.name
		})
	}
}

// TestInvitationForAnotherBox shows the consumer filter keeps another box's
// invitation away, and a worker whose consumer is misconfigured to see it
// refuses it anyway: a refusal outcome, no dead letter.
func TestInvitationForAnotherBox(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	a := newFixture(t, "box-a")
	b := newFixture(t, "box-b")
	b.console, b.release = a.console, a.release // one console invites both
	w, r := a.start(js)
	a.publishFloor(js, a.floor("1.0.0"))
	waitOutcomes(t, js, "box-a", join.OutcomeFloorAccepted, 1)

	b.publishInvitation(js, b.sign(b.invitation()))
	workertest.WaitIdle(t, js, r.ConsumerName())
	if got := workertest.Outcomes(t, js, join.Name, "box-a"); len(got) != 1 {
		t.Fatalf("box-a's worker emitted %d outcomes; only the floor's should be there", len(got))
	}
	if dls := workertest.DeadLetters(t, js, join.Name, "box-a"); len(dls) != 0 {
		t.Fatalf("box-a's worker was given box-b's invitation: %v", dls[0].Reason)
	}

	wide := w.Spec()
	wide.Instance = "misrouted"
	wide.Subjects = []string{"steward.events.invitation.written.>"}
	mis := workertest.Start(t, js, wide, w, fastRetries()...)
	refused := waitOutcomes(t, js, "misrouted", join.OutcomeRefused, 1)
	workertest.WaitIdle(t, js, mis.ConsumerName())
	if refused[0]["rule"] != "addressed" || !strings.Contains(refused[0]["reason"], `the event is addressed to box "box-b", not this box "box-a"`) {
		t.Fatalf("refused outcome %v, want box-b's invitation refused as addressed elsewhere", refused[0])
	}
	assertNoDeadLetters(t, js, "misrouted")
	a.assertOptEmpty()
	if a.armRuns() != 0 {
		t.Fatal("the arm command ran for another box's invitation")
	}
	// By now box-b's invitation has long been in the stream: box-a's own
	// consumer still has not been given it.
	workertest.WaitIdle(t, js, r.ConsumerName())
	if n := len(workertest.Outcomes(t, js, join.Name, "box-a")); n != 1 {
		t.Fatalf("box-a's worker emitted %d outcomes", n)
	}
}

// TestPathSafety sends enrollments and box names that try to leave the opt
// dir, or to pass for options, and shows each is refused (a settled
// refusal, not a dead letter) before any file is touched; an enrollment at
// the length limit still arms.
func TestPathSafety(t *testing.T) {
	bad := []struct{ enrollment, msg string }{
		{"../../../etc/passwd", "holds a path separator"},
		{"a/b", "holds a path separator"},
		{`a\b`, "holds a path separator"},
		{"..", `holds ".."`},
		{"enr..1", `holds ".."`},
		{"-rf", "starts with '-'"},
		{".hidden", "starts with '.'"},
		{"enr\n1", "holds a control character"},
		{"enr\x001", "holds a control character"},
		{"enr\xff", "an enrollment is letters, digits"}, // JSON makes it U+FFFD
		{"enr\u22151", "holds '∕'"},                     // a slash look-alike
		{"enr 1", "holds ' '"},
		{"enr$(id)", "holds '$'"},
		{strings.Repeat("e", join.MaxEnrollment+1), "bytes long, over the 128"},
	}
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	f := newFixture(t, "box-p")
	h, r := f.startRecording(js)
	f.publishFloor(js, f.floor("1.0.0"))
	waitOutcomes(t, js, "box-p", join.OutcomeFloorAccepted, 1)

	want := map[string][]string{} // event id -> what its refusal says
	for _, b := range bad {
		inv := f.invitation()
		inv.Enrollment = b.enrollment
		ack := f.publishInvitation(js, f.sign(inv))
		want[ack.ID] = []string{"[enrollment]: its enrollment", b.msg}
	}
	escape := f.invitation()
	escape.Box = "../../etc"
	escaping := f.sign(escape)
	escaping.Box = f.cfg.Box
	ack := f.publishInvitation(js, escaping)
	want[ack.ID] = []string{`[box]: its signed payload names box "../../etc"`}

	// An event whose key tries to escape never reaches the handler: the
	// runtime's validation refuses it, and that one is a dead letter (it
	// cannot be processed at all). Sent raw, past the publisher.
	e := event.New()
	e.SetID("raw-escape")
	e.SetType(events.TypeInvitationWritten)
	e.SetSource("/test")
	e.SetSubject("../box-p")
	raw, _ := json.Marshal(events.InvitationWritten{Box: "../box-p", Envelope: f.sign(f.invitation()).Envelope})
	if err := e.SetData(events.ContentTypeJSON, raw); err != nil {
		t.Fatal(err)
	}
	msg, err := events.Encode("steward.events.invitation.written.box-p", e)
	if err != nil {
		t.Fatal(err)
	}
	rawAck, err := js.PublishMsg(context.Background(), msg)
	if err != nil {
		t.Fatal(err)
	}
	waitOutcomes(t, js, "box-p", join.OutcomeRefused, len(want))
	dls := waitDeadLetters(t, js, "box-p", 1)
	workertest.WaitIdle(t, js, r.ConsumerName())

	// The reason names the field and the rule, never the value: schema
	// errors do not quote what was sent.
	if len(dls) != 1 || dls[0].Sequence != rawAck.Sequence || !strings.Contains(dls[0].Reason, "invalid event: data of dev.steward.invitation.written.v1 is invalid: /box: does not match pattern") {
		t.Fatalf("dead letters %+v, want the raw event's only", dls)
	}
	if strings.Contains(dls[0].Reason, "../box-p") {
		t.Errorf("the dead letter's reason quotes the value sent: %s", dls[0].Reason)
	}
	for id, parts := range want {
		assertRefused(t, h, publisher.Ack{ID: id}, "box-p", parts...)
	}
	if got := h.of("raw-escape"); len(got) != 0 {
		t.Errorf("the raw event reached the handler: %v", got)
	}
	f.assertOptEmpty()
	if f.armRuns() != 0 {
		t.Fatal("the arm command ran for an unsafe invitation")
	}

	for _, box := range []string{"../x", "a/b", "..", ""} {
		cfg := f.cfg
		cfg.Box = box
		if _, err := join.New(cfg); err == nil || !strings.HasPrefix(err.Error(), "--box:") {
			t.Errorf("box %q: New returned %v, want a --box error", box, err)
		}
	}

	longest := f.invitation()
	longest.Enrollment = strings.Repeat("e", join.MaxEnrollment)
	f.publishInvitation(js, f.sign(longest))
	armed := waitOutcomes(t, js, "box-p", join.OutcomeArmed, 1)
	if armed[0]["enrollment"] != longest.Enrollment {
		t.Fatalf("armed %v", armed[0])
	}
}

// TestArmFailureIsRetriedWithFilesWritten fails the arm command once after
// the files are written (and takes away the instance ID file meanwhile):
// the retry goes straight to the arm command and finishes the job, and the
// files and their folder have the modes the contract says.
func TestArmFailureIsRetriedWithFilesWritten(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	f := newFixture(t, "box-d")
	// A folder left 0755 by someone else is made 0700.
	if err := os.MkdirAll(filepath.Join(f.cfg.OptDir, "system", "join"), 0o755); err != nil {
		t.Fatal(err)
	}
	f.write("fail-once", f.cfg.InstanceIDFile+"\n", 0o644)
	_, r := f.start(js)
	f.publishFloor(js, f.floor("1.4.2"))
	waitOutcomes(t, js, "box-d", join.OutcomeFloorAccepted, 1)
	f.publishInvitation(js, f.sign(f.invitation()))

	armed := waitOutcomes(t, js, "box-d", join.OutcomeArmed, 1)
	workertest.WaitIdle(t, js, r.ConsumerName())
	if armed[0]["box"] != "box-d" || armed[0]["enrollment"] != "enr-1" || armed[0]["deployment"] != "dep" {
		t.Errorf("armed outcome %v", armed[0])
	}
	if n := f.armRuns(); n != 2 {
		t.Fatalf("the arm command ran %d times, want 2 (one failure, one retry)", n)
	}
	if _, err := os.Stat(f.cfg.InstanceIDFile); !os.IsNotExist(err) {
		t.Fatalf("the failing arm run should have removed the instance ID file: %v", err)
	}
	if dls := workertest.DeadLetters(t, js, join.Name, "box-d"); len(dls) != 0 {
		t.Fatalf("dead letter %q", dls[0].Reason)
	}

	pol, enr := join.PolicyPath(f.cfg.OptDir), join.EnrollmentPath(f.cfg.OptDir)
	wantArgs := fmt.Sprintf("-policy %s -identity %s -enrollment %s", pol, f.cfg.IdentityRecord, enr)
	for _, line := range strings.Split(strings.TrimSpace(string(readFile(t, f.path("arm.log")))), "\n") {
		if line != wantArgs {
			t.Errorf("arm command ran with %q, want %q", line, wantArgs)
		}
	}
	for path, want := range map[string]os.FileMode{pol: 0o600, enr: 0o600, filepath.Dir(pol): 0o700 | os.ModeDir} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s has mode %v, want %v", path, fi.Mode(), want)
		}
	}
	var policy join.Policy
	if err := json.Unmarshal(readFile(t, pol), &policy); err != nil {
		t.Fatal(err)
	}
	if policy.Schema != 1 || policy.Deployment != "dep" || policy.Mode != "armed" || policy.Floor.MinAgentVersion != "1.4.2" || policy.Floor.Deployment != "dep" {
		t.Errorf("policy.json %+v", policy)
	}
	var enrollment join.Enrollment
	if err := json.Unmarshal(readFile(t, enr), &enrollment); err != nil {
		t.Fatal(err)
	}
	if enrollment != (join.Enrollment{Box: "box-d", Enrollment: "enr-1", InstanceID: "i-box-d"}) {
		t.Errorf("enrollment.json %+v", enrollment)
	}
	if string(readFile(t, f.cfg.ArmedMarker)) != string(readFile(t, enr)) {
		t.Error("the armed marker is not the enrollment the arm command was given")
	}
	entries, _ := os.ReadDir(filepath.Dir(pol))
	if len(entries) != 2 {
		t.Errorf("the join folder holds %d entries, want policy.json and enrollment.json only (no temp files)", len(entries))
	}

	// Status needs this instance's ID, which the failing run took away.
	if rep := join.Status(context.Background(), f.cfg); rep.Stage != join.StageUnknown || !strings.Contains(rep.Reason, "instance's ID cannot be read") {
		t.Errorf("status without an instance ID: %s", rep)
	}
	f.write("instance-id", "i-box-d\n", 0o644)
	if rep := join.Status(context.Background(), f.cfg); rep.Stage != join.StageArmed {
		t.Errorf("status: %s", rep)
	}
}

// TestReplayArmsOnce replays one invitation three times and through
// Worker.Replay: the guard is armed once. A newer invitation re-arms; the
// older one replayed afterwards is superseded, a settled refusal.
func TestReplayArmsOnce(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	f := newFixture(t, "box-r")
	h, r := f.startRecording(js)
	f.publishFloor(js, f.floor("1.0.0"))
	older := f.sign(f.invitation())
	for range 3 {
		f.publishInvitation(js, older)
	}
	waitOutcomes(t, js, "box-r", join.OutcomeArmed, 1)
	workertest.WaitIdle(t, js, r.ConsumerName())
	// Copies queued together are latest-wins: the earlier ones are
	// superseded by the later (the same signed issuedAt); a copy handled
	// on its own finds the box armed already.
	if already, superseded := len(outcomes(t, js, "box-r", join.OutcomeArmedAlready)), countOutcomes(t, js, "box-r", events.OutcomeSuperseded); already+superseded != 2 {
		t.Fatalf("the two later copies gave %d armed-already and %d superseded outcomes, want 2 together", already, superseded)
	}
	if n := f.armRuns(); n != 1 {
		t.Fatalf("three copies of one invitation ran the arm command %d times", n)
	}

	var replayed int
	err := r.Replayer(t).Replay(context.Background(), replay.From{}, false, nil, func(res replay.Result) {
		replayed++
		if res.Err != nil {
			t.Errorf("replay of %d: %v", res.Sequence, res.Err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if replayed != 4 || f.armRuns() != 1 {
		t.Fatalf("replayed %d events; the arm command ran %d times", replayed, f.armRuns())
	}

	next := f.invitation()
	next.Enrollment = "enr-2"
	next.IssuedAt = issued.Add(time.Hour).Format(time.RFC3339)
	f.publishInvitation(js, f.sign(next))
	waitOutcomes(t, js, "box-r", join.OutcomeArmed, 2)
	workertest.WaitIdle(t, js, r.ConsumerName())
	enrPath := join.EnrollmentPath(f.cfg.OptDir)
	before, _ := os.Stat(enrPath)
	beforeRaw := readFile(t, enrPath)

	olderAgain := f.publishInvitation(js, older)
	superseded := waitOutcomes(t, js, "box-r", join.OutcomeSuperseded, 1)
	workertest.WaitIdle(t, js, r.ConsumerName())
	assertRefused(t, h, olderAgain, "box-r", "is superseded by the accepted one for enrollment enr-2")
	if superseded[0]["enrollment"] != "enr-1" || superseded[0]["accepted"] != "enr-2" {
		t.Errorf("superseded outcome %v", superseded[0])
	}
	if n := f.armRuns(); n != 2 {
		t.Fatalf("the arm command ran %d times, want 2", n)
	}
	var marker join.Enrollment
	if err := json.Unmarshal(readFile(t, f.cfg.ArmedMarker), &marker); err != nil || marker.Enrollment != "enr-2" {
		t.Fatalf("marker %+v (%v), want enr-2", marker, err)
	}
	after, _ := os.Stat(enrPath)
	if string(readFile(t, enrPath)) != string(beforeRaw) || !after.ModTime().Equal(before.ModTime()) {
		t.Error("enrollment.json was rewritten by an older invitation")
	}
	if dls := workertest.DeadLetters(t, js, join.Name, "box-r"); len(dls) != 0 {
		t.Fatalf("dead letter %q", dls[0].Reason)
	}
}

// TestNoFloorYetIsRetried shows an invitation that arrives before any host
// floor is retried rather than refused, and arms once the floor arrives.
func TestNoFloorYetIsRetried(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	f := newFixture(t, "box-n")
	attempts, _ := f.startCounting(js, workers.WithMaxDeliver(1000))
	f.publishInvitation(js, f.sign(f.invitation()))
	workertest.WaitUntil(t, "the invitation is tried three times", func() bool { return attempts.Load() >= 3 })
	if got := workertest.DeadLetters(t, js, join.Name, "box-n"); len(got) != 0 {
		t.Fatalf("an invitation without a floor went to the DLQ: %s", got[0].Reason)
	}
	if got := outcomes(t, js, "box-n", join.OutcomeRefused); len(got) != 0 {
		t.Fatalf("an invitation without a floor was refused: %v", got)
	}
	f.assertOptEmpty()

	f.publishFloor(js, f.floor("1.0.0"))
	waitOutcomes(t, js, "box-n", join.OutcomeArmed, 1)
	if got := workertest.DeadLetters(t, js, join.Name, "box-n"); len(got) != 0 {
		t.Fatalf("dead letter %q", got[0].Reason)
	}
}

// TestUnreadableFactsAreRetried shows an identity record that cannot be
// read and a metadata server that does not answer are retried, never
// refused, and the invitation arms once both can be read.
func TestUnreadableFactsAreRetried(t *testing.T) {
	var up atomic.Bool
	var hits atomic.Int64
	meta := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		hits.Add(1)
		if !up.Load() || req.Header.Get("Metadata-Flavor") != "Google" {
			http.Error(rw, "metadata not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(rw, "i-box-u")
	}))
	defer meta.Close()

	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	f := newFixture(t, "box-u")
	f.cfg.InstanceIDFile, f.cfg.InstanceIDURL = "", meta.URL+"/computeMetadata/v1/instance/id"
	record := readFile(t, f.cfg.IdentityRecord)
	inv := f.invitation()
	if err := os.Remove(f.cfg.IdentityRecord); err != nil {
		t.Fatal(err)
	}
	attempts, _ := f.startCounting(js, workers.WithMaxDeliver(1000))
	f.publishFloor(js, f.floor("1.0.0"))
	waitOutcomes(t, js, "box-u", join.OutcomeFloorAccepted, 1)
	f.publishInvitation(js, f.sign(inv))

	// While the record is missing the metadata server is never asked.
	workertest.WaitUntil(t, "the invitation is retried while the record is missing", func() bool { return attempts.Load() >= 3 })
	if hits.Load() != 0 {
		t.Fatalf("the metadata server was asked %d times before the record was read", hits.Load())
	}
	f.write("identity.json", string(record), 0o644)
	workertest.WaitUntil(t, "the metadata server is asked twice", func() bool { return hits.Load() >= 2 })
	if got := workertest.DeadLetters(t, js, join.Name, "box-u"); len(got) != 0 {
		t.Fatalf("an unreadable fact sent the invitation to the DLQ: %s", got[0].Reason)
	}
	f.assertOptEmpty()
	up.Store(true)
	waitOutcomes(t, js, "box-u", join.OutcomeArmed, 1)
	if got := outcomes(t, js, "box-u", join.OutcomeRefused); len(got) != 0 {
		t.Fatalf("refused: %v", got)
	}
}

// countOutcomes counts a box's outcomes of one kind, whatever their data.
func countOutcomes(t *testing.T, js jetstream.JetStream, box, outcome string) int {
	t.Helper()
	n := 0
	for _, e := range workertest.Outcomes(t, js, join.Name, box) {
		if e.Type() == events.OutcomeType(join.Name, outcome) {
			n++
		}
	}
	return n
}
