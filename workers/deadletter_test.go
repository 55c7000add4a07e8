package workers_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// rawRotation is a credential.rotated message built without the
// publisher's validation, as any NATS client can publish it: data is
// whatever the attacker writes.
func rawRotation(t testing.TB, id, hive string, data []byte) *nats.Msg {
	t.Helper()
	e, err := events.New(events.TypeCredentialRotated, hive, data)
	if err != nil {
		t.Fatal(err)
	}
	e.SetID(id)
	e.SetSource("/attacker")
	e.SetTime(time.Now().UTC())
	msg, err := events.Encode("steward.events.credential.rotated."+hive, e)
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

func publishRaw(t testing.TB, js jetstream.JetStream, msg *nats.Msg) *jetstream.PubAck {
	t.Helper()
	ack, err := js.PublishMsg(context.Background(), msg)
	if err != nil {
		t.Fatalf("publish %s: %v", msg.Subject, err)
	}
	return ack
}

func lastSeq(t testing.TB, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	s, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

func lettersByID(t testing.TB, js jetstream.JetStream, instance string) map[string]events.DeadLetter {
	t.Helper()
	out := map[string]events.DeadLetter{}
	for _, d := range workertest.DeadLetters(t, js, testWorker, instance) {
		out[d.EventID()] = d
	}
	return out
}

// shortDLQDedupe shortens the DLQ's duplicate window to 3 s, so a
// squatter's dedupe entry expires within the test.
func shortDLQDedupe(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	ctx := context.Background()
	s, err := js.Stream(ctx, events.StreamDLQ)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Duplicates = 3 * time.Second
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

const badData = `{"hive":"HIVE","version":0,"clientId":"c","secret":"-----BEGIN AGE ENCRYPTED FILE-----"}`

func bad(hive string) []byte { return []byte(strings.ReplaceAll(badData, "HIVE", hive)) }

// TestDeadLetterSuppressedByPublisherHeaders is finding 12.5, first attack:
// the publisher of an invalid event adds JetStream headers that its own
// publish passes and the copy into the DLQ fails (Nats-Expected-*), and
// forges the runtime's headers in another case. Today's dead letter copies
// every header, so the DLQ write fails on every delivery and the event
// never reaches the DLQ. Each must now land in the DLQ, with only its ce-*
// and content headers and the worker's own Steward-* headers.
func TestDeadLetterSuppressedByPublisherHeaders(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	w := workertest.Start(t, js, spec("sup"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error { return nil }),
		workers.WithAckWait(300*time.Millisecond))
	// One letter in the DLQ and one event in the stream, so the two
	// streams' sequences differ.
	publishRotation(t, js, "ok", 1)
	publishRaw(t, js, rawRotation(t, "plain-bad", "pb", bad("pb")))
	workertest.WaitUntil(t, "the first letter is stored", func() bool { return len(lettersByID(t, js, "sup")) == 1 })
	workertest.WaitIdle(t, js, w.ConsumerName())

	attacks := map[string]func(h nats.Header){
		"expected-last-seq": func(h nats.Header) {
			h.Set(jetstream.ExpectedLastSeqHeader, strconv.FormatUint(lastSeq(t, js, events.StreamEvents), 10))
		},
		"expected-last-subj-seq": func(h nats.Header) { h.Set(jetstream.ExpectedLastSubjSeqHeader, "0") },
		"expected-stream-lower":  func(h nats.Header) { h["nats-expected-stream"] = []string{events.StreamEvents} },
		"forged-steward": func(h nats.Header) {
			h["steward-subject"] = []string{"$JS.API.STREAM.PURGE." + events.StreamEvents}
			h["STEWARD-WORKER"] = []string{"converge-prod"}
			h.Set(events.HeaderStreamSeq, "1")
			h.Set(events.HeaderDigest, "sha256:00")
		},
	}
	for name, attack := range attacks {
		hive := strings.ReplaceAll(name, "-", "")
		msg := rawRotation(t, "attack-"+name, hive, bad(hive))
		attack(msg.Header)
		publishRaw(t, js, msg)
		workertest.WaitIdle(t, js, w.ConsumerName())
	}
	workertest.WaitUntil(t, "every attacking event is in the DLQ", func() bool { return len(lettersByID(t, js, "sup")) == 1+len(attacks) })
	for name := range attacks {
		d := lettersByID(t, js, "sup")["attack-"+name]
		for k := range d.Headers {
			lk := strings.ToLower(k)
			// The worker's own: its id, and the stream its write expects.
			own := k == nats.MsgIdHdr || k == jetstream.ExpectedStreamHeader && d.Headers.Get(k) == events.StreamDLQ
			if strings.HasPrefix(lk, "nats-") && !own || strings.HasPrefix(lk, "steward-") && !strings.HasPrefix(k, "Steward-") {
				t.Errorf("%s: the letter carries the publisher's header %s: %v", name, k, d.Headers[k])
			}
		}
		if d.Worker != "rt-sup" || strings.Contains(d.Subject, "$JS") || d.Digest == "sha256:00" || d.Sequence == 1 {
			t.Errorf("%s: forged runtime headers survived: worker %q subject %q digest %q seq %d", name, d.Worker, d.Subject, d.Digest, d.Sequence)
		}
		if err := d.Verify(); err != nil || d.Event == nil {
			t.Errorf("%s: the letter does not hold its original: %v", name, err)
		}
	}
}

// TestDeadLetterSquattedID is finding 12.5, second attack: the letter's
// Nats-Msg-Id is predictable, so a letter published first under it makes
// JetStream drop the real one as a duplicate, and today the worker takes
// "duplicate" for success and terminates the event. The attacker here
// knows everything the id is made of (consumer, sequence, and the digest of
// the event it publishes) and squats both the old and the new form. The
// worker must read the stored letter back, refuse it as not its own
// (loudly), keep the event, and store its own letter once the squatter's
// dedupe entry expires.
func TestDeadLetterSquattedID(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	var logs workertest.Logs
	w := workertest.Start(t, js, spec("sq"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error { return nil }),
		workers.WithAckWait(300*time.Millisecond), workers.WithLogger(zerolog.New(&logs)))
	shortDLQDedupe(t, js)

	msg := rawRotation(t, "victim", "v1", bad("v1"))
	seq := lastSeq(t, js, events.StreamEvents) + 1
	digest := events.LetterDigest(msg.Subject, msg.Header, msg.Data)
	for _, id := range []string{
		"dlq-rt-sq-" + strconv.FormatUint(seq, 10),
		events.LetterMsgID("rt-sq", seq, digest),
	} {
		squat := nats.NewMsg(events.DLQSubject(testWorker, "sq"))
		squat.Header.Set(nats.MsgIdHdr, id)
		squat.Header.Set(events.HeaderWorker, "rt-sq")
		squat.Header.Set(events.HeaderStreamSeq, strconv.FormatUint(seq, 10))
		squat.Header.Set(events.HeaderDigest, digest)
		squat.Header.Set(events.HeaderError, "nothing to see here")
		squat.Data = []byte(`{}`)
		publishRaw(t, js, squat)
	}
	if got := publishRaw(t, js, msg).Sequence; got != seq {
		t.Fatalf("the victim was stored at %d, not the predicted %d", got, seq)
	}
	workertest.WaitUntil(t, "the worker stores the victim's own letter", func() bool {
		for _, d := range workertest.DeadLetters(t, js, testWorker, "sq") {
			if d.EventID() == "victim" && d.Verify() == nil && d.Sequence == seq && d.Reason != "nothing to see here" {
				return true
			}
		}
		return false
	})
	workertest.WaitIdle(t, js, w.ConsumerName())
	if !strings.Contains(logs.String(), "holds another letter under this dead letter's id") {
		t.Fatalf("the squatted id was not reported:\n%s", logs.String())
	}
	own := 0
	for _, d := range workertest.DeadLetters(t, js, testWorker, "sq") {
		if d.EventID() == "victim" && d.Verify() == nil {
			own++
		}
	}
	if own != 1 {
		t.Fatalf("%d letters of the victim, want 1", own)
	}
}

// TestDeadLetterSquattedWithItsOwnContent: the squatter stores, under the
// letter's id, the very letter the worker would write (it can compute all
// of it) but unsigned. Same content is not enough: the worker refuses it
// as not its own, keeps the event, and stores its own signed letter once
// the dedupe entry expires, so the DLQ holds a letter readers believe.
func TestDeadLetterSquattedWithItsOwnContent(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	var logs workertest.Logs
	w := workertest.Start(t, js, spec("sq2"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error { return nil }),
		workers.WithAckWait(300*time.Millisecond), workers.WithLogger(zerolog.New(&logs)))
	shortDLQDedupe(t, js)
	msg := rawRotation(t, "victim", "v1", bad("v1"))
	seq := lastSeq(t, js, events.StreamEvents) + 1
	squat, _ := events.NewDeadLetter(events.LetterSource{
		Consumer: "rt-sq2", DLQSubject: events.DLQSubject(testWorker, "sq2"), Stream: events.StreamEvents,
		Sequence: seq, Subject: msg.Subject, Delivered: 1, Reason: "nothing to see here", Header: msg.Header, Data: msg.Data,
	})
	publishRaw(t, js, squat)
	if got := publishRaw(t, js, msg).Sequence; got != seq {
		t.Fatalf("the victim was stored at %d, not the predicted %d", got, seq)
	}
	workertest.WaitUntil(t, "the worker stores its own signed letter", func() bool {
		for _, d := range workertest.DeadLetters(t, js, testWorker, "sq2") {
			if d.EventID() == "victim" && d.VerifyProof(workertest.Verifier(), "") == nil {
				return true
			}
		}
		return false
	})
	workertest.WaitIdle(t, js, w.ConsumerName())
	if !strings.Contains(logs.String(), "carries no proof of its writer") {
		t.Fatalf("the unsigned squat was not reported as such:\n%s", logs.String())
	}
}

// TestDeadLetterRedeliveryFindsItsOwnLetter is the case the duplicate
// answer exists for: a process wrote the letter and stopped before it
// settled the event. The redelivery's write is a duplicate of its own
// letter, which it reads back, accepts and settles: one letter, no retry.
func TestDeadLetterRedeliveryFindsItsOwnLetter(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	ctx := context.Background()
	ack := publishRaw(t, js, rawRotation(t, "crashed", "c1", bad("c1")))
	s, err := js.Stream(ctx, events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	orig, err := s.GetMsg(ctx, ack.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	// What the process that stopped wrote, with another reason and count.
	letter, _ := events.NewDeadLetter(events.LetterSource{
		Consumer: "rt-own", DLQSubject: events.DLQSubject(testWorker, "own"), Stream: events.StreamEvents,
		Sequence: ack.Sequence, Subject: orig.Subject, Delivered: 3, Reason: "an earlier delivery's reason",
		Header: orig.Header, Data: orig.Data, Signer: workertest.Signer("rt-own"),
	})
	publishRaw(t, js, letter)
	var logs workertest.Logs
	w := workertest.Start(t, js, spec("own"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error { return nil }),
		workers.WithLogger(zerolog.New(&logs)))
	workertest.WaitIdle(t, js, w.ConsumerName())
	if n := len(workertest.DeadLetters(t, js, testWorker, "own")); n != 1 {
		t.Fatalf("%d letters, want the one already stored", n)
	}
	if !strings.Contains(logs.String(), "already stored by an earlier delivery") {
		t.Fatalf("the stored letter was not recognised:\n%s", logs.String())
	}
}

// TestDeadLetterOversizeKeptByReference is finding 12.5, third attack: an
// event near the server's max payload (1 MiB) is refused by the schema,
// and today its copy with the runtime's headers exceeds the max payload,
// so the DLQ write fails on every delivery. The letter must keep it by
// reference: stream, sequence and digest, with its data truncated, and the
// digest must prove the original.
func TestDeadLetterOversizeKeptByReference(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	w := workertest.Start(t, js, spec("big"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error { return nil }))
	probe := rawRotation(t, "huge", "h1", nil)
	room := int(js.Conn().MaxPayload()) - 2048
	for _, vs := range probe.Header {
		for _, v := range vs {
			room -= len(v) + 40
		}
	}
	data := `{"hive":"h1","version":1,"clientId":"` + strings.Repeat("x", room-100) + `","secret":"-----BEGIN AGE ENCRYPTED FILE-----"}`
	ack := publishRaw(t, js, rawRotation(t, "huge", "h1", []byte(data)))
	workertest.WaitIdle(t, js, w.ConsumerName())
	list := workertest.DeadLetters(t, js, testWorker, "big")
	if len(list) != 1 {
		t.Fatalf("%d letters for the oversize event, want 1", len(list))
	}
	d := list[0]
	if !d.Truncated || d.Stream != events.StreamEvents || d.Sequence != ack.Sequence || d.OriginalSize != len(data) || len(d.Data) >= len(data) {
		t.Fatalf("letter not kept by reference: truncated %v stream %q seq %d size %d, %d bytes kept", d.Truncated, d.Stream, d.Sequence, d.OriginalSize, len(d.Data))
	}
	if d.EventID() != "huge" || !strings.Contains(d.Reason, "over the limit") {
		t.Fatalf("letter id %q reason %q", d.EventID(), d.Reason)
	}
	if !errors.Is(d.Verify(), events.ErrLetterUnverifiable) {
		t.Fatalf("a truncated letter verified on its own: %v", d.Verify())
	}
	s, err := js.Stream(context.Background(), events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	orig, err := s.GetMsg(context.Background(), d.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.VerifyOriginal(orig.Subject, orig.Header, orig.Data); err != nil {
		t.Fatal(err)
	}
	if err := d.VerifyOriginal(orig.Subject, orig.Header, orig.Data[1:]); err == nil {
		t.Fatal("the digest accepts another original")
	}
}

// TestDeadLetterDLQDownKeepsEventAndOrder: when the DLQ cannot be written
// the event is kept, never dropped, and the next event of its key does not
// overtake it. Today the next event is applied at once (the checkpoint is
// cached) and moves the key past the dead one, whose redelivery is then
// skipped: it is gone, in neither the DLQ nor applied.
func TestDeadLetterDLQDownKeepsEventAndOrder(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	var applied atomic.Int32
	var letterFirst atomic.Bool
	w := workertest.Start(t, js, spec("down"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		if versionOf(t, d) == 1 {
			return workers.Permanent(errors.New("version 1 can never apply"))
		}
		if s, err := js.Stream(ctx, events.StreamDLQ); err == nil {
			if info, err := s.Info(ctx); err == nil && info.State.Msgs == 1 {
				letterFirst.Store(true)
			}
		}
		applied.Add(1)
		return nil
	}), workers.WithAckWait(300*time.Millisecond), workers.WithRegisterer(reg))
	if err := js.DeleteStream(ctx, events.StreamDLQ); err != nil {
		t.Fatal(err)
	}
	publishRotation(t, js, "k", 1)
	publishRotation(t, js, "k", 2)
	workertest.WaitUntil(t, "the failed DLQ write is retried", func() bool { return counter(t, reg, "retried") >= 2 })
	if applied.Load() != 0 {
		t.Fatal("version 2 was applied while version 1, before it, was not settled")
	}
	if err := events.EnsureStreams(ctx, js, events.DefaultStreamConfig()); err != nil {
		t.Fatal(err)
	}
	workertest.WaitUntil(t, "version 2 is applied", func() bool { return applied.Load() == 1 })
	workertest.WaitIdle(t, js, w.ConsumerName())
	list := workertest.DeadLetters(t, js, testWorker, "down")
	if len(list) != 1 || list[0].Event == nil {
		t.Fatalf("%d letters, want version 1's", len(list))
	}
	var data events.CredentialRotated
	if err := json.Unmarshal(list[0].Event.Data(), &data); err != nil || data.Version != 1 {
		t.Fatalf("the letter holds %+v (%v), want version 1", data, err)
	}
	if !letterFirst.Load() {
		t.Fatal("version 2 was applied before version 1 reached the DLQ")
	}
}

// TestDeadLetterReasonNeverQuotesSecret is finding 12.6 at the worker: a
// rotation whose secret is a pasted plaintext reaches the worker over raw
// NATS (the publisher would refuse it). Its refusal is logged, put in the
// dead letter's Steward-Error and in JetStream's termination advisory;
// none may hold the plaintext, and the reason still names the field.
func TestDeadLetterReasonNeverQuotesSecret(t *testing.T) {
	const plain = "correct-horse-battery-staple-42"
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	advisories, err := js.Conn().SubscribeSync("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.>")
	if err != nil {
		t.Fatal(err)
	}
	var logs workertest.Logs
	w := workertest.Start(t, js, spec("sec"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error { return nil }),
		workers.WithLogger(zerolog.New(&logs)))
	publishRaw(t, js, rawRotation(t, "pasted", "p1", []byte(`{"hive":"p1","version":1,"clientId":"c","secret":"`+plain+`"}`)))
	workertest.WaitIdle(t, js, w.ConsumerName())
	list := workertest.DeadLetters(t, js, testWorker, "sec")
	if len(list) != 1 {
		t.Fatalf("%d letters", len(list))
	}
	if r := list[0].Reason; strings.Contains(r, plain) || !strings.Contains(r, "/secret") {
		t.Fatalf("Steward-Error %q quotes the secret or does not name the field", r)
	}
	if strings.Contains(logs.String(), plain) {
		t.Fatalf("the worker logged the secret:\n%s", logs.String())
	}
	adv, err := advisories.NextMsg(workertest.DefaultTimeout)
	if err != nil {
		t.Fatalf("no termination advisory: %v", err)
	}
	if strings.Contains(string(adv.Data), plain) || !strings.Contains(string(adv.Data), "/secret") {
		t.Fatalf("the termination advisory quotes the secret or does not name the field: %s", adv.Data)
	}
}
