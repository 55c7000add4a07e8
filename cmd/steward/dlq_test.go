package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers/workertest"
)

// dlqFixture is a NATS server with Steward's streams and one real event
// stored, which a purge would remove.
func dlqFixture(t *testing.T) (jetstream.JetStream, string) {
	t.Helper()
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	workertest.PublishData(t, js, events.TypeReleasePublished, "1.0.0", events.ReleasePublished{Version: "1.0.0"})
	return js, "--nats-url=" + srv.URL()
}

// rotationMsg is a valid rotation for hive, encoded as it travels.
func rotationMsg(t *testing.T, hive string) *nats.Msg {
	t.Helper()
	e, err := events.New(events.TypeCredentialRotated, hive, events.CredentialRotated{
		Hive: hive, Version: 1, ClientID: "c", Secret: "-----BEGIN AGE ENCRYPTED FILE-----\nx\n-----END AGE ENCRYPTED FILE-----\n"})
	if err != nil {
		t.Fatal(err)
	}
	e.SetID("rot-" + hive)
	e.SetSource("/test")
	e.SetTime(time.Now().UTC())
	msg, err := events.Encode("steward.events.credential.rotated."+hive, e)
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

// forge publishes a letter straight to the DLQ, as anyone who may write to
// steward.dlq.> can: headers and data are the forger's.
func forge(t *testing.T, js jetstream.JetStream, subject string, header nats.Header, data []byte) uint64 {
	t.Helper()
	msg := nats.NewMsg(subject)
	msg.Header = header
	msg.Data = data
	ack, err := js.PublishMsg(context.Background(), msg)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

func dlqStreamState(t *testing.T, js jetstream.JetStream, name string) (msgs, first uint64) {
	t.Helper()
	s, err := js.Stream(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs, info.State.FirstSeq
}

func dlqHas(t *testing.T, js jetstream.JetStream, seq uint64) bool {
	t.Helper()
	s, err := js.Stream(context.Background(), events.StreamDLQ)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.GetMsg(context.Background(), seq)
	return err == nil
}

// TestDLQRetryForgedLetterCannotPurge is finding 12.3 as the attack: forged
// letters name $JS.API.STREAM.PURGE.STEWARD_EVENTS as their original
// subject, and an operator runs `dlq retry --all --worker test`, twice.
// Today the retry publishes to that subject with the operator's
// credentials and the events stream is purged. Now a letter whose event
// decodes and validates goes to the subject its event maps to; one that
// holds no event, or whose worker header disagrees with its DLQ subject,
// is refused and kept; and the events stream keeps every event.
func TestDLQRetryForgedLetterCannotPurge(t *testing.T) {
	js, url := dlqFixture(t)
	purge := "$JS.API.STREAM.PURGE." + events.StreamEvents
	valid := rotationMsg(t, "h9")
	valid.Header.Set(events.HeaderWorker, "test-one")
	valid.Header.Set(events.HeaderSubject, purge)
	validSeq := forge(t, js, events.DLQSubject("test", "one"), valid.Header, valid.Data)
	undecodable := forge(t, js, events.DLQSubject("test", "one"), nats.Header{
		events.HeaderWorker: {"test-one"}, events.HeaderSubject: {purge}}, []byte(`{}`))
	other := rotationMsg(t, "h8")
	other.Header.Set(events.HeaderWorker, "test-two")
	other.Header.Set(events.HeaderSubject, purge)
	mismatched := forge(t, js, events.DLQSubject("test", "one"), other.Header, other.Data)

	for round := 1; round <= 2; round++ {
		r := run(t, nil, "dlq", "retry", url, "--all", "--worker", "test")
		if r.code == 0 {
			t.Fatalf("round %d: retry of forged letters succeeded:\n%s\n%s", round, r.stdout, r.stderr)
		}
		if msgs, first := dlqStreamState(t, js, events.StreamEvents); first != 1 || msgs != 2 {
			t.Fatalf("round %d: %s holds %d events from %d: it was purged (or the forged event republished twice)\n%s", round, events.StreamEvents, msgs, first, r.stderr)
		}
		if !dlqHas(t, js, undecodable) || !dlqHas(t, js, mismatched) {
			t.Fatalf("round %d: a refused letter was deleted", round)
		}
		if !strings.Contains(r.stderr, "does not hold a readable CloudEvent") || !strings.Contains(r.stderr, `"test-two"`) {
			t.Fatalf("round %d: the refusals do not name the state found:\n%s", round, r.stderr)
		}
	}
	if dlqHas(t, js, validSeq) {
		t.Fatal("the letter whose event was republished is still in the DLQ")
	}
	s, err := js.Stream(context.Background(), events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(context.Background(), 2)
	if err != nil {
		t.Fatal(err)
	}
	if m.Subject != "steward.events.credential.rotated.h9" || m.Header.Get(events.HeaderSubject) != "" || m.Header.Get(events.HeaderWorker) != "" {
		t.Fatalf("republished to %s with headers %v", m.Subject, m.Header)
	}
}

// TestDLQRetryKeepsLetterWhenRepublishIsDuplicate is the second half of
// finding 12.3: the retry's Nats-Msg-Id is predictable, so a message
// published first under it makes JetStream answer "duplicate" and store
// nothing. Today the retry ignores the flag and deletes the letter: the
// event is lost. The letter must be kept, and the refusal say why.
func TestDLQRetryKeepsLetterWhenRepublishIsDuplicate(t *testing.T) {
	js, url := dlqFixture(t)
	orig := rotationMsg(t, "h7")
	letter, digest := events.NewDeadLetter(events.LetterSource{
		Consumer: "test-one", DLQSubject: events.DLQSubject("test", "one"), Stream: events.StreamEvents,
		Sequence: 99, Subject: orig.Subject, Delivered: 1, Reason: "the hive's folder is read-only",
		Header: orig.Header, Data: orig.Data,
	})
	seq := forge(t, js, letter.Subject, letter.Header, letter.Data)
	for _, id := range []string{"steward-dlq-retry-" + strconv.FormatUint(seq, 10), retryMsgID(seq, digest)} {
		squat := rotationMsg(t, "h7")
		squat.Header.Set(nats.MsgIdHdr, id)
		squat.Data = []byte(strings.Replace(string(squat.Data), `"clientId":"c"`, `"clientId":"squatter"`, 1))
		if _, err := js.PublishMsg(context.Background(), squat); err != nil {
			t.Fatal(err)
		}
	}
	before, _ := dlqStreamState(t, js, events.StreamEvents)
	r := run(t, nil, "dlq", "retry", url, strconv.FormatUint(seq, 10))
	if r.code == 0 || !strings.Contains(r.stderr, "duplicate") || !strings.Contains(r.stderr, "letter is kept") {
		t.Fatalf("retry over a squatted id: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if !dlqHas(t, js, seq) {
		t.Fatal("the letter was deleted though nothing was stored")
	}
	if after, _ := dlqStreamState(t, js, events.StreamEvents); after != before {
		t.Fatalf("%d events stored, want %d", after, before)
	}
}

// TestDLQLsShowEscapeTerminalSequences is finding 12.12: an event id (and
// a reason) carrying an OSC 52 clipboard write and cursor moves that hide
// lines. ls and show must print them escaped, never raw.
func TestDLQLsShowEscapeTerminalSequences(t *testing.T) {
	js, url := dlqFixture(t)
	msg := rotationMsg(t, "h6")
	evil := "id\x1b]52;c;cm0gLXJmIH4K\x07\x1b[2A\x1b[2K\u202egnp.exe\u009b"
	msg.Header.Set("ce-id", evil)
	msg.Header.Set(events.HeaderWorker, "test-one")
	msg.Header.Set(events.HeaderError, "failed\x1b[8m hidden")
	seq := forge(t, js, events.DLQSubject("test", "one"), msg.Header, []byte(strings.Replace(string(msg.Data), `"c"`, `"c\u001b \u009b \u202e"`, 1)))
	for _, args := range [][]string{{"dlq", "ls", url}, {"dlq", "show", url, strconv.FormatUint(seq, 10)}} {
		r := ok(t, nil, args...)
		for _, c := range []string{"\x1b", "\x07", "\u202e", "\u009b"} {
			if strings.Contains(r.stdout, c) || strings.Contains(r.stderr, c) {
				t.Fatalf("%s prints %q raw:\n%q", strings.Join(args[:2], " "), c, r.stdout)
			}
		}
		if !strings.Contains(r.stdout, `\x1b]52;c;`) {
			t.Fatalf("%s does not show the escaped id:\n%s", strings.Join(args[:2], " "), r.stdout)
		}
	}
}

// TestServeDefaultsToLoopback: the ingress binds 127.0.0.1 unless told
// otherwise, and offers TLS and a connection limit (finding 12.7).
func TestServeDefaultsToLoopback(t *testing.T) {
	fs := newServeCmd(&globals{}).Flags()
	if d := fs.Lookup("listen").DefValue; d != "127.0.0.1:8080" {
		t.Fatalf("--listen defaults to %q", d)
	}
	for _, name := range []string{"tls-cert", "tls-key", "max-conns"} {
		if fs.Lookup(name) == nil {
			t.Fatalf("no --%s", name)
		}
	}
}

// TestTerminalSafe: control characters, bidi overrides and broken UTF-8
// come out escaped; ordinary text, UTF-8 included, as it is.
func TestTerminalSafe(t *testing.T) {
	for in, want := range map[string]string{
		"plain":                 "plain",
		"héllo wörld":           "héllo wörld",
		"a\x1b[2Ab":             `a\x1b[2Ab`,
		"tab\there\nnl":         `tab\x09here\x0anl`,
		"\u202eevil":            `\u202eevil`,
		"c1\u009b":              `c1\u009b`,
		"bad\xffutf8":           `bad\xffutf8`,
		"osc\x1b]52;c;Zm9v\x07": `osc\x1b]52;c;Zm9v\x07`,
	} {
		if got := terminalSafe(in); got != want {
			t.Errorf("terminalSafe(%q) = %q, want %q", in, got, want)
		}
	}
}
