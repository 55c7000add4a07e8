package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/workers"
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
	for _, id := range []string{"steward-dlq-retry-" + strconv.FormatUint(seq, 10), ops.RetryMsgID(seq, digest)} {
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
	show := strconv.FormatUint(seq, 10)
	for _, args := range [][]string{{"dlq", "ls", url}, {"dlq", "show", url, show}, {"dlq", "ls", url, "--json"}, {"dlq", "show", url, show, "--json"}} {
		r := ok(t, nil, args...)
		for _, c := range []string{"\x1b", "\x07", "\u202e", "\u009b"} {
			if strings.Contains(r.stdout, c) || strings.Contains(r.stderr, c) {
				t.Fatalf("%s prints %q raw:\n%q", strings.Join(args[:2], " "), c, r.stdout)
			}
		}
		if !strings.Contains(r.stdout, `\x1b]52;c;`) && !strings.Contains(r.stdout, `\u001b]52;c;`) {
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

// letterFor writes a dead letter of a valid rotation of hive as worker
// test-<instance> would, and returns its DLQ sequence.
func letterFor(t *testing.T, js jetstream.JetStream, instance, hive, reason string) uint64 {
	t.Helper()
	orig := rotationMsg(t, hive)
	letter, _ := events.NewDeadLetter(events.LetterSource{
		Consumer: "test-" + instance, DLQSubject: events.DLQSubject("test", instance), Stream: events.StreamEvents,
		Sequence: 1, Subject: orig.Subject, Delivered: 2, Reason: reason, Header: orig.Header, Data: orig.Data,
	})
	return forge(t, js, letter.Subject, letter.Header, letter.Data)
}

// auditOf reads the audit lines a dlq command logged (JSON, on stderr).
func auditOf(t *testing.T, stderr string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(stderr, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["audit"] == "dlq" {
			out = append(out, m)
		}
	}
	return out
}

// TestDLQLifecycleCommands runs ls (filters, --json), show --json, rm (a
// dry run, then a filter), retry --all of a worker at a rate, and purge,
// and checks what each prints, removes and logs.
func TestDLQLifecycleCommands(t *testing.T) {
	js, url := dlqFixture(t)
	h1 := letterFor(t, js, "one", "h1", "the hive's folder is read-only")
	h2 := letterFor(t, js, "one", "h2", "schema: unknown field")
	h3 := letterFor(t, js, "two", "h3", "the hive's folder is READ-ONLY")

	var list ops.LetterList
	r := ok(t, nil, "dlq", "ls", url, "--reason", "read-only", "--json")
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list.Letters) != 2 {
		t.Fatalf("ls --reason --json: %v\n%s", err, r.stdout)
	}
	if l := list.Letters[0]; l.Sequence != h1 || l.Time.IsZero() || l.Type != events.TypeCredentialRotated || l.Key != "h1" || l.WorkerName != "test" || l.Instance != "one" || l.Deliveries != 2 {
		t.Fatalf("ls --json letter: %+v", l)
	}
	r = ok(t, nil, "dlq", "ls", url, "--type", "credential.rotated", "--key", "h2")
	if rows := strings.Split(strings.TrimSpace(r.stdout), "\n"); len(rows) != 2 || !strings.HasPrefix(rows[1], strconv.FormatUint(h2, 10)+" ") ||
		!strings.Contains(rows[0], "STORED") || !strings.Contains(rows[1], "credential.rotated") || !strings.Contains(rows[1], "unknown field") {
		t.Fatalf("ls --type --key:\n%s", r.stdout)
	}
	if r := ok(t, nil, "dlq", "ls", url, "--since", "1h", "--worker", "test-one"); strings.Count(r.stdout, "\n") != 3 {
		t.Fatalf("ls --since 1h --worker test-one:\n%s", r.stdout)
	}
	if r := ok(t, nil, "dlq", "ls", url, "--until", "1h"); !strings.HasPrefix(r.stdout, "no dead letters (filters: --until \"1h\")") || strings.Contains(r.stdout, "SEQ") {
		t.Fatalf("ls --until 1h:\n%s", r.stdout)
	}
	if r := run(t, nil, "dlq", "ls", url, "--type", "nothing"); r.code == 0 || !strings.Contains(r.stderr, events.TypeCredentialRotated) {
		t.Fatalf("ls --type nothing: exit %d\n%s", r.code, r.stderr)
	}

	var d ops.LetterDetail
	r = ok(t, nil, "dlq", "show", url, strconv.FormatUint(h2, 10), "--json")
	if err := json.Unmarshal([]byte(r.stdout), &d); err != nil || d.Check != "verified" || !strings.Contains(d.Data, `"secret": "[elided]"`) || len(d.Headers) == 0 {
		t.Fatalf("show --json: %v\n%s", err, r.stdout)
	}
	if strings.Contains(r.stdout, "BEGIN AGE") {
		t.Fatalf("show --json prints the secret:\n%s", r.stdout)
	}

	if r := run(t, nil, "dlq", "rm", url); r.code == 0 || !strings.Contains(r.stderr, "purge --yes") {
		t.Fatalf("rm without a selection: exit %d\n%s", r.code, r.stderr)
	}
	r = ok(t, nil, "dlq", "rm", url, "--reason", "read-only", "--dry-run")
	if strings.Count(r.stdout, "\n") != 3 || !dlqHas(t, js, h1) || !dlqHas(t, js, h3) {
		t.Fatalf("rm --dry-run:\n%s", r.stdout)
	}
	r = ok(t, nil, "dlq", "rm", url, "--reason", "read-only")
	if dlqHas(t, js, h1) || dlqHas(t, js, h3) || !dlqHas(t, js, h2) || strings.Count(r.stdout, "removed dlq seq=") != 2 {
		t.Fatalf("rm --reason read-only removed the wrong letters:\n%s\n%s", r.stdout, r.stderr)
	}
	if a := auditOf(t, r.stderr); len(a) != 2 || a[0]["action"] != "remove" || a[0]["result"] != "removed" || a[0]["dlq_seq"] != float64(h1) ||
		a[0]["event_id"] != "rot-h1" || a[0]["worker"] != "test-one" {
		t.Fatalf("rm audit lines: %v\n%s", a, r.stderr)
	}
	if r := run(t, nil, "dlq", "rm", url, strconv.FormatUint(h1, 10)); r.code == 0 || !strings.Contains(r.stderr, "no dead letter") {
		t.Fatalf("rm of a removed letter: exit %d\n%s", r.code, r.stderr)
	}

	if r := run(t, nil, "dlq", "retry", url, "--all", "--rate", "0", "--worker", "test"); r.code == 0 || !strings.Contains(r.stderr, "--rate") {
		t.Fatalf("retry --rate 0: exit %d\n%s", r.code, r.stderr)
	}
	r = ok(t, nil, "dlq", "retry", url, "--all", "--worker", "test", "--rate", "50")
	if !strings.Contains(r.stdout, "retried dlq seq="+strconv.FormatUint(h2, 10)+" id=rot-h2 worker=test-one subject=steward.events.credential.rotated.h2 new-seq=2") {
		t.Fatalf("retry --all:\n%s\n%s", r.stdout, r.stderr)
	}
	if a := auditOf(t, r.stderr); len(a) != 1 || a[0]["result"] != "retried" || a[0]["new_seq"] != float64(2) {
		t.Fatalf("retry audit lines: %v", a)
	}

	// purge takes ls's filter: only the letters it matches go.
	h5 := letterFor(t, js, "two", "h5", "of instance two")
	if r := run(t, nil, "dlq", "purge", url, "--worker", "test-two"); r.code == 0 || !strings.Contains(r.stderr, "the 1 dead letters the filter (--worker \"test-two\")") || !dlqHas(t, js, h5) {
		t.Fatalf("purge --worker without --yes: exit %d\n%s", r.code, r.stderr)
	}
	letterFor(t, js, "one", "h4", "later")
	r = ok(t, nil, "dlq", "purge", url, "--worker", "test-two", "--yes")
	if dlqHas(t, js, h5) || strings.Count(r.stdout, "removed dlq seq=") != 1 {
		t.Fatalf("purge --worker test-two --yes:\n%s\n%s", r.stdout, r.stderr)
	}
	if r := run(t, nil, "dlq", "purge", url); r.code == 0 || !strings.Contains(r.stderr, "all 1 dead letters") {
		t.Fatalf("purge without --yes: exit %d\n%s", r.code, r.stderr)
	}
	r = ok(t, nil, "dlq", "purge", url, "--yes")
	if msgs, _ := dlqStreamState(t, js, events.StreamDLQ); msgs != 0 || !strings.Contains(r.stdout, "purged dlq seq=") {
		t.Fatalf("purge --yes left %d letters:\n%s", msgs, r.stdout)
	}
	// The events stream lost nothing: the fixture's release and the retry.
	if msgs, _ := dlqStreamState(t, js, events.StreamEvents); msgs != 2 {
		t.Fatalf("%s holds %d events after the lifecycle, want 2", events.StreamEvents, msgs)
	}
}

// TestDLQLsFollow proves dlq ls --follow --json prints the stored letters
// its filter selects, then each one stored afterwards as one JSON line
// (another worker's letters left out), and ends cleanly when its context is
// cancelled (Ctrl-C).
func TestDLQLsFollow(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	fail := workers.HandlerFunc(func(context.Context, *workers.Delivery) error {
		return workers.Permanent(errors.New("the hive's folder is gone"))
	})
	publishRotation(t, js, "h1", 1)
	w := workertest.Start(t, js, testSpec("h1"), fail)
	workertest.WaitIdle(t, js, w.ConsumerName())

	g := &globals{natsURL: srv.URL(), replicas: 1, log: zerolog.Nop()}
	cmd := newDLQCmd(g)
	var stdout workertest.Logs
	cmd.SetOut(&stdout)
	cmd.SetErr(io.Discard)
	cmd.SetArgs([]string{"ls", "--worker", "credential-h1", "--follow", "--json"})
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()

	lines := func() []ops.Letter {
		var out []ops.Letter
		for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
			if l == "" {
				continue
			}
			var letter ops.Letter
			if err := json.Unmarshal([]byte(l), &letter); err != nil {
				t.Fatalf("--follow --json line %q is not one JSON letter: %v", l, err)
			}
			out = append(out, letter)
		}
		return out
	}
	workertest.WaitUntil(t, "the stored letter is printed", func() bool { return len(lines()) == 1 })
	// A letter of another instance, which the filter leaves out, then one
	// of h1's: only h1's is printed.
	publishRotation(t, js, "h2", 1)
	w2 := workertest.Start(t, js, testSpec("h2"), fail)
	workertest.WaitIdle(t, js, w2.ConsumerName())
	publishRotation(t, js, "h1", 2)
	workertest.WaitIdle(t, js, w.ConsumerName())
	workertest.WaitUntil(t, "the new letter of h1 is printed", func() bool { return len(lines()) == 2 })
	got := lines()
	if got[0].EventID != "rot-h1-1" || got[1].EventID != "rot-h1-2" || !strings.Contains(got[1].Reason, "folder is gone") {
		t.Fatalf("followed %+v", got)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("dlq ls --follow ended with %v, want nil when interrupted", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("dlq ls --follow did not end when its context was cancelled")
	}
	if n := len(lines()); n != 2 {
		t.Fatalf("%d letters printed, want 2 (h2's is not of credential-h1)", n)
	}

}
