package e2e

import (
	"context"
	"crypto"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers/join"
)

// floodEvent is one event of the flood: either valid (published through the
// Publisher) or malformed (a raw NATS message, as a broken or hostile
// publisher would send it).
type floodEvent struct {
	kind   string
	valid  bool
	worker string // the consumer that must see it: credential-hive-1 or join-box-1
	event  event.Event
	raw    *nats.Msg
	// outcome is the outcome type a valid event must get.
	outcome []string
	// refused marks a malformed event the worker can read and whose rules
	// say no (a bad signature, a secret for another key): it gets a
	// refused outcome, once, and never reaches the DLQ.
	refused []string

	seq   uint64
	acked time.Time
}

const (
	floodHive = "hive-1"
	floodBox  = "box-1"
	floodDep  = "e2e"
)

// floodKit holds what the flood's events are made from.
type floodKit struct {
	t                testing.TB
	hiveRecipient    string
	wrongRecipient   string
	console, release crypto.Signer
	forger           crypto.Signer
	// controller signs the rotations, as the workers take them only
	// signed (issue 12).
	controller         crypto.Signer
	evidence, issuedAt string
	n                  int
}

func (k *floodKit) id(kind string) string {
	k.n++
	return fmt.Sprintf("flood-%s-%04d", kind, k.n)
}

func (k *floodKit) event(typ, key string, data any, kind string) event.Event {
	k.t.Helper()
	e, err := events.New(typ, key, data)
	if err != nil {
		k.t.Fatal(err)
	}
	e.SetID(k.id(kind))
	e.SetSource("/steward/e2e")
	e.SetTime(time.Now().UTC())
	return e
}

// raw encodes e as the NATS message a publisher would send, for breaking.
func (k *floodKit) raw(subject string, e event.Event) *nats.Msg {
	k.t.Helper()
	m, err := events.Encode(subject, e)
	if err != nil {
		k.t.Fatal(err)
	}
	m.Header.Set(nats.MsgIdHdr, e.ID())
	return m
}

// rotationData is a rotation signed by the controller, so each case is
// refused or applied for what it is about, never for its signature.
func (k *floodKit) rotationData(version uint64, recipient string) events.CredentialRotated {
	k.t.Helper()
	d, err := signing.SignRotation(k.controller, events.CredentialRotated{
		Hive: floodHive, Version: version, ClientID: fmt.Sprintf("client-%d", version),
		Secret: encryptTo(k.t, recipient, fmt.Sprintf("secret-%d", version)),
	})
	if err != nil {
		k.t.Fatal(err)
	}
	return d
}

func (k *floodKit) invitation(signer crypto.Signer, enrollment string) events.InvitationWritten {
	k.t.Helper()
	inv, err := join.SignInvitation(signer, events.Invitation{
		V: 1, Deployment: floodDep, Box: floodBox, Enrollment: enrollment,
		EvidenceSHA256: k.evidence, IssuedAt: k.issuedAt,
	})
	if err != nil {
		k.t.Fatal(err)
	}
	return inv
}

func (k *floodKit) floor(signer crypto.Signer, minAgent string) events.HostFloorPublished {
	k.t.Helper()
	f, err := join.SignHostFloor(signer, events.HostFloor{
		V: 1, Deployment: floodDep, MinAgentVersion: minAgent,
		Binaries: []string{strings.Repeat("ab", 32)},
	})
	if err != nil {
		k.t.Fatal(err)
	}
	return f
}

const credSubject = events.EventsPrefix + ".credential.rotated." + floodHive

// malformed builds one malformed event of each kind, numbered i.
func (k *floodKit) malformed(i int) []floodEvent {
	k.t.Helper()
	cred := func(kind string, m *nats.Msg) floodEvent {
		return floodEvent{kind: kind, worker: "credential-" + floodHive, raw: m}
	}
	joinEv := func(kind string, m *nats.Msg) floodEvent {
		return floodEvent{kind: kind, worker: "join-" + floodBox, raw: m}
	}
	refusal := func(f floodEvent, outcome string) floodEvent {
		f.refused = []string{outcome}
		return f
	}
	rot := func(kind string) event.Event {
		return k.event(events.TypeCredentialRotated, floodHive, k.rotationData(uint64(1_000_000+i), k.hiveRecipient), kind)
	}
	var out []floodEvent

	m := k.raw(credSubject, rot("unknown-type"))
	m.Header.Set("ce-type", "dev.steward.credential.revoked.v1")
	out = append(out, cred("unknown-type", m))

	g := k.event(events.TypeGrantChanged, floodHive, events.GrantChanged{Machine: floodHive, Requirement: "postgres", Generation: 1, Given: []events.Given{}}, "foreign-type")
	out = append(out, cred("foreign-type", k.raw(credSubject, g)))

	m = k.raw(credSubject, rot("broken-json"))
	m.Data = []byte(`{"hive":"hive-1","version":`)
	out = append(out, cred("broken-json", m))

	m = nats.NewMsg(credSubject)
	m.Header.Set("content-type", "application/cloudevents+json")
	m.Header.Set(nats.MsgIdHdr, k.id("structured-garbage"))
	m.Data = []byte(`{"specversion":"1.0","type":`)
	out = append(out, cred("structured-garbage", m))

	big := events.CredentialRotated{Hive: floodHive, Version: uint64(2_000_000 + i), ClientID: "client-big",
		Secret: "-----BEGIN AGE ENCRYPTED FILE-----\n" + strings.Repeat("A", 200<<10) + "\n-----END AGE ENCRYPTED FILE-----\n"}
	out = append(out, cred("oversized", k.raw(credSubject, k.event(events.TypeCredentialRotated, floodHive, big, "oversized"))))

	wrong := k.event(events.TypeCredentialRotated, floodHive, k.rotationData(uint64(3_000_000+i), k.wrongRecipient), "wrong-recipient")
	out = append(out, refusal(cred("wrong-recipient", k.raw(credSubject, wrong)), "refused"))

	m = k.raw(credSubject, rot("missing-id"))
	m.Header.Del("ce-id")
	m.Header.Del("ce-source")
	out = append(out, cred("missing-attributes", m))

	extra := map[string]any{"hive": floodHive, "version": 4_000_000 + i, "clientId": "c", "secret": encryptTo(k.t, k.hiveRecipient, "s"), "note": "unknown field"}
	m = k.raw(credSubject, rot("unknown-field"))
	m.Data, _ = json.Marshal(extra)
	out = append(out, cred("unknown-field", m))

	other := k.event(events.TypeCredentialRotated, "hive-2", events.CredentialRotated{Hive: "hive-2", Version: 1, ClientID: "c", Secret: rotationSecret}, "subject-mismatch")
	out = append(out, cred("subject-mismatch", k.raw(credSubject, other)))

	invSubject := events.EventsPrefix + ".invitation.written." + floodBox
	forged := k.event(events.TypeInvitationWritten, floodBox, k.invitation(k.forger, fmt.Sprintf("forged-%d", i)), "forged-invitation")
	out = append(out, refusal(joinEv("forged-invitation", k.raw(invSubject, forged)), "refused"))

	tamperedData := k.invitation(k.console, fmt.Sprintf("tampered-%d", i))
	evil, _ := json.Marshal(events.Invitation{V: 1, Deployment: floodDep, Box: floodBox, Enrollment: fmt.Sprintf("evil-%d", i), EvidenceSHA256: k.evidence, IssuedAt: k.issuedAt})
	tamperedData.Envelope.Payload = base64.StdEncoding.EncodeToString(evil)
	tampered := k.event(events.TypeInvitationWritten, floodBox, tamperedData, "tampered-invitation")
	out = append(out, refusal(joinEv("tampered-invitation", k.raw(invSubject, tampered)), "refused"))

	forgedFloor := k.event(events.TypeHostFloorPublished, floodDep, k.floor(k.forger, fmt.Sprintf("9.%d.0", i)), "forged-floor")
	out = append(out, refusal(joinEv("forged-floor", k.raw(events.EventsPrefix+".hostfloor.published", forgedFloor)), "floor-refused"))
	return out
}

// TestFaultMalformedFlood is fault 5. Invariant: malformed events (wrong
// types, broken JSON, oversized data, bad signatures, missing attributes,
// unknown fields, keys that do not match their subject) interleaved with
// valid ones never stall the stream: every one that cannot be processed is
// in the DLQ, once, with a reason, after one delivery; every one the rules
// refuse (bad signatures, a secret for another key) gets its refused
// outcome, once, and no dead letter; every valid one gets its outcome, in
// order, or is superseded by a newer one of its key (latest wins); the
// files end as the last valid event says.
func TestFaultMalformedFlood(t *testing.T) {
	const (
		rotationsN = 120
		badRounds  = 10
		validInvs  = 5
	)
	rng := rand.New(rand.NewPCG(seed(t), 5))
	n := startNATS(t, "n1")
	b := connect(t, n.url())
	b.ensureStreams(t, 1)

	keys := t.TempDir()
	hiveRec := recipientOf(t, makeKey(t, keys, "age", "hive"))
	wrongRec := recipientOf(t, makeKey(t, keys, "age", "stranger"))
	for _, name := range []string{"console", "release", "forger", "controller"} {
		makeKey(t, keys, "ed25519", name)
	}
	signer := func(name string) crypto.Signer {
		s, err := signing.LoadPrivateKey(filepath.Join(keys, name+".key"))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	box := t.TempDir()
	identity := filepath.Join(box, "identity.json")
	if err := os.WriteFile(identity, []byte(`{"box":"box-1","instanceId":"i-e2e-1"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(box, "instance-id"), []byte("i-e2e-1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	evidence, err := join.EvidenceOf(identity)
	if err != nil {
		t.Fatal(err)
	}
	kit := &floodKit{t: t, hiveRecipient: hiveRec, wrongRecipient: wrongRec,
		console: signer("console"), release: signer("release"), forger: signer("forger"), controller: signer("controller"),
		evidence: evidence, issuedAt: time.Now().UTC().Truncate(time.Second).Format(time.RFC3339)}

	credDir := t.TempDir()
	credW := startWorker(t, "credential", map[string]string{
		"STEWARD_NATS_URL":       n.url(),
		"STEWARD_HIVE":           floodHive,
		"STEWARD_CONTROLLER_KEY": filepath.Join(keys, "controller.pub"),
		"STEWARD_AGE_IDENTITY":   filepath.Join(keys, "hive.key"),
		"STEWARD_CREDENTIAL_DIR": credDir,
	})
	marker := filepath.Join(box, "armed.json")
	joinW := startWorker(t, "join", map[string]string{
		"STEWARD_NATS_URL":         n.url(),
		"STEWARD_BOX":              floodBox,
		"STEWARD_DEPLOYMENT":       floodDep,
		"STEWARD_CONSOLE_KEY":      filepath.Join(keys, "console.pub"),
		"STEWARD_RELEASE_KEY":      filepath.Join(keys, "release.pub"),
		"STEWARD_IDENTITY_RECORD":  identity,
		"STEWARD_INSTANCE_ID_FILE": filepath.Join(box, "instance-id"),
		"STEWARD_OPT_DIR":          filepath.Join(box, "opt"),
		"STEWARD_ARM_COMMAND":      filepath.Join(repoRoot, "deploy", "arm-standin.sh"),
		"STEWARD_ARMED_MARKER":     marker,
	})

	// The valid events keep their order (versions count up; the floor
	// comes before any invitation); the malformed ones are shuffled in.
	var valid []floodEvent
	valid = append(valid, floodEvent{kind: "floor", valid: true, worker: "join-" + floodBox, outcome: []string{"floor-accepted"},
		event: kit.event(events.TypeHostFloorPublished, floodDep, kit.floor(kit.release, "1.0.0"), "floor")})
	for v := uint64(1); v <= rotationsN; v++ {
		valid = append(valid, floodEvent{kind: "rotation", valid: true, worker: "credential-" + floodHive, outcome: []string{"applied", "superseded"},
			event: kit.event(events.TypeCredentialRotated, floodHive, kit.rotationData(v, hiveRec), "rotation")})
	}
	for i := range validInvs {
		// Copies of one invitation: the first handled arms, a later one
		// finds the box armed, or one queued behind another is superseded.
		ok := []string{"armed", "armed-already", "superseded"}
		inv := floodEvent{kind: "invitation", valid: true, worker: "join-" + floodBox, outcome: ok,
			event: kit.event(events.TypeInvitationWritten, floodBox, kit.invitation(kit.console, "enr-1"), "invitation")}
		at := 1 + (i+1)*rotationsN/(validInvs+1)
		valid = slices.Insert(valid, at, inv)
	}
	var bad []floodEvent
	for i := range badRounds {
		bad = append(bad, kit.malformed(i)...)
	}
	rng.Shuffle(len(bad), func(i, j int) { bad[i], bad[j] = bad[j], bad[i] })
	flood := make([]floodEvent, 0, len(valid)+len(bad))
	vi, bi := 0, 0
	for vi < len(valid) || bi < len(bad) {
		if bi < len(bad) && (vi == len(valid) || vi > 0 && rng.IntN(len(valid)+len(bad)) < len(bad)) {
			flood = append(flood, bad[bi])
			bi++
		} else {
			flood = append(flood, valid[vi])
			vi++
		}
	}

	// An event over the server's max_payload never enters the stream.
	huge := nats.NewMsg(credSubject)
	huge.Data = make([]byte, 2<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := b.js.PublishMsg(ctx, huge); err == nil {
		t.Errorf("a 2 MiB message was stored; the server's max_payload should refuse it")
	}
	// The publisher refuses what the workers would dead-letter.
	if _, err := b.pub.Publish(ctx, floodEventOf(t, bad, "oversized")); !publisher.IsInvalid(err) {
		t.Errorf("the publisher let an oversized event through: %v", err)
	}

	start := time.Now()
	for i := range flood {
		f := &flood[i]
		if f.valid {
			f.seq = b.publish(t, f.event)
		} else {
			ack, err := b.js.PublishMsg(ctx, f.raw)
			if err != nil {
				t.Fatalf("publish malformed %s: %v", f.kind, err)
			}
			f.seq = ack.Sequence
		}
		f.acked = time.Now()
	}
	published := time.Since(start)

	for _, c := range []string{"credential-" + floodHive, "join-" + floodBox} {
		waitFor(t, c+" has settled the flood", 2*time.Minute, func() (bool, string) { return b.consumerIdle(c) })
	}
	drained := time.Since(start)

	dead := map[uint64]events.DeadLetter{}
	for _, dl := range append(b.deadLetters(t, "credential", floodHive), b.deadLetters(t, "join", floodBox)...) {
		if _, dup := dead[dl.Sequence]; dup {
			t.Errorf("event at sequence %d is in the DLQ twice", dl.Sequence)
		}
		dead[dl.Sequence] = dl
	}
	outcomes := map[string][]event.Event{}
	for _, w := range [][2]string{{"credential", floodHive}, {"join", floodBox}} {
		for cause, list := range outcomesByCause(t, b, w[0], w[1]) {
			outcomes[cause] = append(outcomes[cause], list...)
		}
	}

	badByKind := map[string]int{}
	reasons := map[string]string{}
	var latencies durations
	var lastVersion uint64
	dupOutcomes, lostValid := 0, 0
	for _, f := range flood {
		dl, isDead := dead[f.seq]
		if !f.valid && f.refused != nil {
			badByKind[f.kind]++
			outs := outcomes[f.raw.Header.Get("ce-id")]
			switch {
			case isDead:
				t.Errorf("refused %s (sequence %d) is in the DLQ (%s); a refusal is an outcome", f.kind, f.seq, dl.Reason)
			case len(outs) != 1:
				t.Errorf("refused %s (sequence %d) has %d outcomes; want 1", f.kind, f.seq, len(outs))
			default:
				name := strings.TrimSuffix(strings.TrimPrefix(outs[0].Type(), "dev.steward."+strings.Split(f.worker, "-")[0]+"."), ".v1")
				if !slices.Contains(f.refused, name) {
					t.Errorf("refused %s (sequence %d): outcome %s; want %v", f.kind, f.seq, outs[0].Type(), f.refused)
				}
				if _, ok := reasons[f.kind]; !ok {
					reasons[f.kind] = string(outs[0].Data())
				}
			}
			continue
		}
		if !f.valid {
			badByKind[f.kind]++
			switch {
			case !isDead:
				t.Errorf("malformed %s (sequence %d) is not in the DLQ", f.kind, f.seq)
			case strings.TrimSpace(dl.Reason) == "":
				t.Errorf("malformed %s (sequence %d) is in the DLQ without a reason", f.kind, f.seq)
			case dl.Headers.Get("Steward-Worker") != f.worker:
				t.Errorf("malformed %s (sequence %d) dead-lettered by %q; want %s", f.kind, f.seq, dl.Headers.Get("Steward-Worker"), f.worker)
			case dl.Delivered != 1:
				t.Errorf("malformed %s (sequence %d) took %d deliveries; no retry can fix it, so want 1", f.kind, f.seq, dl.Delivered)
			}
			if _, ok := reasons[f.kind]; !ok && isDead {
				reasons[f.kind] = dl.Reason
			}
			continue
		}
		if isDead {
			t.Errorf("valid %s %s is in the DLQ: %s", f.kind, f.event.ID(), dl.Reason)
			continue
		}
		outs := outcomes[f.event.ID()]
		if len(outs) > 1 {
			dupOutcomes += len(outs) - 1
		}
		if len(outs) == 0 {
			lostValid++
		}
		if len(outs) != 1 {
			t.Errorf("valid %s %s has %d outcomes; want 1", f.kind, f.event.ID(), len(outs))
			continue
		}
		o := outs[0]
		name := strings.TrimSuffix(strings.TrimPrefix(o.Type(), "dev.steward."+strings.Split(f.worker, "-")[0]+"."), ".v1")
		if !slices.Contains(f.outcome, name) {
			t.Errorf("valid %s %s: outcome %s (%s); want %v", f.kind, f.event.ID(), o.Type(), o.Data(), f.outcome)
		}
		if f.kind == "rotation" && name == "applied" {
			var a struct {
				Version uint64 `json:"version"`
			}
			_ = json.Unmarshal(o.Data(), &a)
			if a.Version <= lastVersion {
				t.Errorf("rotation %d applied after %d", a.Version, lastVersion)
			}
			lastVersion = a.Version
		}
		latencies = append(latencies, o.Time().Sub(f.acked))
	}
	refusedN := 0
	for _, f := range bad {
		if f.refused != nil {
			refusedN++
		}
	}
	if len(dead) != len(bad)-refusedN {
		t.Errorf("%d dead letters; want exactly the %d malformed events no worker can process", len(dead), len(bad)-refusedN)
	}

	clientID, err := os.ReadFile(filepath.Join(credDir, "client_id"))
	if err != nil || strings.TrimSpace(string(clientID)) != fmt.Sprintf("client-%d", rotationsN) {
		t.Errorf("client_id holds %q (%v); want client-%d", clientID, err, rotationsN)
	}
	secret, err := os.ReadFile(filepath.Join(credDir, "secret"))
	if err != nil || strings.TrimSpace(string(secret)) != fmt.Sprintf("secret-%d", rotationsN) {
		t.Errorf("secret does not hold the last version's (%v)", err)
	}
	armed, err := os.ReadFile(marker)
	if err != nil || !strings.Contains(string(armed), `"enr-1"`) {
		t.Errorf("armed marker %q (%v); want enrollment enr-1", armed, err)
	}
	for _, s := range []*stewardService{credW, joinW} {
		if gone, err := s.exited(); gone {
			t.Errorf("%s exited during the flood: %v", s.name, err)
		}
	}

	kinds := slices.Sorted(func(yield func(string) bool) {
		for k := range badByKind {
			if !yield(k) {
				return
			}
		}
	})
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	p50 := time.Duration(0)
	if len(latencies) > 0 {
		p50 = latencies[len(latencies)/2]
	}
	summary(t, "fault5-malformed-flood",
		"events", len(flood), "valid", len(valid), "malformed", len(bad), "malformed_kinds", len(kinds),
		"dead_lettered", len(dead), "refused", refusedN, "valid_handled", len(latencies), "lost", lostValid,
		"duplicates_applied", dupOutcomes, "oversize_refused_by_server", 1,
		"latency_p50", round(p50), "latency_max", round(latencies.max()),
		"publish", round(published), "drained", round(drained))
	for _, k := range kinds {
		t.Logf("  %-20s x%d  reason: %.160s", k, badByKind[k], reasons[k])
	}
}

// floodEventOf returns the first malformed event of a kind as an event,
// decoded from its raw message.
func floodEventOf(t testing.TB, list []floodEvent, kind string) event.Event {
	t.Helper()
	for _, f := range list {
		if f.kind == kind {
			e, err := events.Decode(f.raw.Header, f.raw.Data)
			if err != nil {
				t.Fatal(err)
			}
			return e
		}
	}
	t.Fatalf("no %s event", kind)
	return event.Event{}
}
