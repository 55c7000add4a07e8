package join_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"strings"
	"testing"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers/join"
	"github.com/steward-dev/steward/workers/workertest"
)

// TestHostFloors keeps the newest verified floor: bad floors are refused
// with their own reasons (settled refusals, never dead letters) and the
// kept floor stays; an older floor does not replace a newer one; another
// deployment's floor is acknowledged quietly.
func TestHostFloors(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	f := newFixture(t, "box-f")
	h, r := f.startRecording(js)

	f.publishFloor(js, f.floor("1.2.0"))
	waitOutcomes(t, js, "box-f", join.OutcomeFloorAccepted, 1)
	if kept := stateFloor(t, r); kept.Floor.MinAgentVersion != "1.2.0" {
		t.Fatalf("kept floor %+v", kept)
	}

	_, stranger, _ := ed25519.GenerateKey(rand.Reader)
	signed := func(key any, floor events.HostFloor) events.HostFloorPublished {
		d, err := join.SignHostFloor(key.(ed25519.PrivateKey), floor)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	signedRaw := func(key ed25519.PrivateKey, payload string) events.HostFloorPublished {
		env, err := signing.SignEnvelope(key, events.PayloadTypeHostFloor, []byte(payload))
		if err != nil {
			t.Fatal(err)
		}
		return events.HostFloorPublished{Deployment: "dep", Envelope: env}
	}
	good := events.HostFloor{V: 1, Deployment: "dep", MinAgentVersion: "9.0.0", Binaries: []string{strings.Repeat("0", 64)}}
	with := func(change func(*events.HostFloor)) events.HostFloor {
		fl := good
		fl.Binaries = append([]string(nil), good.Binaries...)
		change(&fl)
		return fl
	}
	releaseKey := f.release.(ed25519.PrivateKey)
	bad := []struct {
		data       events.HostFloorPublished
		rule, want string
	}{
		{signed(stranger, good), "signature", "does not verify with the release key"},
		{signed(releaseKey, with(func(fl *events.HostFloor) { fl.V = 2 })), "version", "its payload has v 2"},
		{signed(releaseKey, with(func(fl *events.HostFloor) { fl.Deployment = "prod" })), "deployment", `names deployment "prod", not "dep"`},
		{signed(releaseKey, with(func(fl *events.HostFloor) { fl.MinAgentVersion = "v9" })), "minAgentVersion", "is not a semantic version"},
		{signed(releaseKey, with(func(fl *events.HostFloor) { fl.Binaries = []string{"../../bin/sh"} })), "binaries", `binaries[0] "../../bin/sh" is not a SHA-256`},
		// jq shows 9.0.0 and the reviewed binary; encoding/json alone would
		// keep the later case twin and the later duplicate.
		{signedRaw(releaseKey, `{"v":1,"deployment":"dep","minAgentVersion":"9.0.0","binaries":["`+good.Binaries[0]+`"],"MinAgentVersion":"0.0.1"}`),
			"payload", `key "MinAgentVersion" in $ is not a field of the document`},
		{signedRaw(releaseKey, `{"v":1,"deployment":"dep","minAgentVersion":"9.0.0","binaries":["`+good.Binaries[0]+`"],"binaries":["`+strings.Repeat("e", 64)+`"]}`),
			"payload", `key "binaries" appears twice`},
	}
	acks := make([]publisher.Ack, len(bad))
	for i := range bad {
		// A floor signed for prod is still published on dep's key, as an
		// attacker replaying it would.
		bad[i].data.Deployment = "dep"
		acks[i] = f.publishFloor(js, bad[i].data)
	}
	// A hostfloor envelope for an invitation's payload type never gets
	// past OpenEnvelope.
	env, err := signing.SignEnvelope(releaseKey, events.PayloadTypeInvitation, []byte(`{"v":1}`))
	if err != nil {
		t.Fatal(err)
	}
	env.PayloadType = events.PayloadTypeHostFloor
	retyped := f.publishFloor(js, events.HostFloorPublished{Deployment: "dep", Envelope: env})

	refused := waitOutcomes(t, js, "box-f", join.OutcomeFloorRefused, len(bad)+1)
	workertest.WaitIdle(t, js, r.ConsumerName())
	// Refusals are settled with their outcomes, never dead letters.
	assertNoDeadLetters(t, js, "box-f")
	for i, b := range bad {
		assertRefused(t, h, acks[i], "deployment dep", "["+b.rule+"]", b.want, "the floor kept before stays")
		if refused[i]["rule"] != b.rule || refused[i]["deployment"] != "dep" || !strings.Contains(refused[i]["reason"], b.want) {
			t.Errorf("floor %d: outcome %v, want rule %s saying %q", i, refused[i], b.rule, b.want)
		}
	}
	assertRefused(t, h, retyped, "deployment dep", "[signature]")
	if kept := stateFloor(t, r); kept.Floor.MinAgentVersion != "1.2.0" {
		t.Fatalf("after refused floors the kept floor is %+v, want 1.2.0", kept)
	}

	// Another deployment's floor: not this box's business, and no fault.
	other := events.HostFloor{V: 1, Deployment: "elsewhere", MinAgentVersion: "99.0.0"}
	f.publishFloor(js, signed(stranger, other))
	f.publishFloor(js, f.floor("1.1.0"))
	kept := waitOutcomes(t, js, "box-f", join.OutcomeFloorKept, 1)
	if kept[0]["minAgentVersion"] != "1.1.0" || kept[0]["kept"] != "1.2.0" {
		t.Errorf("floor-kept outcome %v", kept[0])
	}
	f.publishFloor(js, f.floor("1.10.0"))
	waitOutcomes(t, js, "box-f", join.OutcomeFloorAccepted, 2)
	workertest.WaitIdle(t, js, r.ConsumerName())
	if got := stateFloor(t, r); got.Floor.MinAgentVersion != "1.10.0" || got.Floor.Deployment != "dep" || got.EventID == "" {
		t.Fatalf("kept floor %+v, want 1.10.0 (semver order, not string order)", got)
	}
	assertNoDeadLetters(t, js, "box-f")
	if got := len(workertest.Outcomes(t, js, join.Name, "box-f")); got != 2+len(bad)+1+1 {
		t.Fatalf("%d outcomes; another deployment's floor should emit none", got)
	}
}
