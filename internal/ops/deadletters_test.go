package ops_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/internal/streamread"
	"github.com/steward-dev/steward/workers/workertest"
)

// letterSpec is one dead letter a test writes as a worker would.
type letterSpec struct {
	worker, instance string
	hive             string
	version          int
	origSeq          uint64
	reason           string
}

// writeLetter stores a letter of a valid rotation, as the runtime writes
// one (events.NewDeadLetter), and returns its DLQ sequence.
func writeLetter(t *testing.T, js jetstream.JetStream, s letterSpec) uint64 {
	t.Helper()
	msg := letterMsg(t, s)
	ack, err := js.PublishMsg(context.Background(), msg)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// letterMsg is the letter the runtime would write for s's rotation.
func letterMsg(t *testing.T, s letterSpec) *nats.Msg {
	t.Helper()
	e, err := events.New(events.TypeCredentialRotated, s.hive, rotation(s.hive, s.version))
	if err != nil {
		t.Fatal(err)
	}
	e.SetID(fmt.Sprintf("rot-%s-%d", s.hive, s.version))
	e.SetSource("/test")
	e.SetTime(time.Now().UTC())
	orig, err := events.Encode(events.EventsPrefix+".credential.rotated."+s.hive, e)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := events.NewDeadLetter(events.LetterSource{
		Consumer: ops.ConsumerName(s.worker, s.instance), DLQSubject: events.DLQSubject(s.worker, s.instance),
		Stream: events.StreamEvents, Sequence: s.origSeq, Subject: orig.Subject, Delivered: 1, Reason: s.reason,
		Header: orig.Header, Data: orig.Data,
	})
	return msg
}

func list(t *testing.T, js jetstream.JetStream, f ops.LetterFilter) []ops.Letter {
	t.Helper()
	l, err := ops.ListLetters(context.Background(), js, f, ops.Proofs{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Letters
}

func seqsOf(ls []ops.Letter) []uint64 {
	out := []uint64{}
	for _, l := range ls {
		out = append(out, l.Sequence)
	}
	return out
}

// TestDLQFilterRemovesExactlyWhatItMatched writes letters of two workers,
// several keys and reasons, selects some by worker, key, type, reason and
// the time STEWARD_DLQ stored them, removes the selection, and proves that
// exactly the matched letters are gone: every other letter, and one
// written after the selection was read, is still there.
func TestDLQFilterRemovesExactlyWhatItMatched(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	ctx := context.Background()
	specs := []letterSpec{
		{"credential", "h1", "h1", 1, 1, "the hive's folder is read-only"},
		{"credential", "h1", "h1", 2, 2, "schema: unknown field"},
		{"credential", "h2", "h2", 1, 3, "the hive's folder is READ-ONLY"},
		{"provision", "m1", "h1", 1, 4, "the hive's folder is read-only"},
		{"credential", "h-3", "h-3", 1, 5, "disk full"},
	}
	var seqs []uint64
	for _, s := range specs {
		seqs = append(seqs, writeLetter(t, js, s))
	}
	all := list(t, js, ops.LetterFilter{})
	if len(all) != 5 {
		t.Fatalf("%d letters listed, want 5", len(all))
	}
	for i, l := range all {
		if l.Sequence != seqs[i] || l.Time.IsZero() || l.Type != events.TypeCredentialRotated || l.Key != specs[i].hive || !l.Readable || l.WorkerMismatch {
			t.Fatalf("letter %d: %+v", i, l)
		}
	}
	for _, c := range []struct {
		f    ops.LetterFilter
		want []uint64
	}{
		{ops.LetterFilter{Worker: "credential"}, []uint64{seqs[0], seqs[1], seqs[2], seqs[4]}},
		{ops.LetterFilter{Worker: "credential-h1"}, []uint64{seqs[0], seqs[1]}},
		{ops.LetterFilter{Worker: "credential-h-3"}, []uint64{seqs[4]}},
		{ops.LetterFilter{Key: "h1"}, []uint64{seqs[0], seqs[1], seqs[3]}},
		{ops.LetterFilter{Reason: "read-only"}, []uint64{seqs[0], seqs[2], seqs[3]}},
		{ops.LetterFilter{Type: events.TypeGrantChanged}, []uint64{}},
		{ops.LetterFilter{Since: all[2].Time}, []uint64{seqs[2], seqs[3], seqs[4]}},
		{ops.LetterFilter{Until: all[2].Time}, []uint64{seqs[0], seqs[1]}},
		{ops.LetterFilter{Seqs: []uint64{seqs[1], 999}}, []uint64{seqs[1]}},
	} {
		// Letters stored within one clock tick share a time; the time
		// cases hold only when the stream's clock moved between them.
		if (!c.f.Since.IsZero() || !c.f.Until.IsZero()) && !all[1].Time.Before(all[2].Time) {
			t.Logf("letters %d and %d share a stored time: the time cases are not checked", seqs[1], seqs[2])
			continue
		}
		if got := seqsOf(list(t, js, c.f)); !slices.Equal(got, c.want) {
			t.Errorf("filter %+v selects %v, want %v", c.f, got, c.want)
		}
	}

	f := ops.LetterFilter{Worker: "credential", Reason: "read-only"}
	matched := list(t, js, f)
	if got := seqsOf(matched); !slices.Equal(got, []uint64{seqs[0], seqs[2]}) {
		t.Fatalf("the selection is %v", got)
	}
	// A letter of the same worker and reason arrives after the selection
	// was read: the removal must not touch it.
	late := writeLetter(t, js, letterSpec{"credential", "h1", "h1", 3, 6, "read-only again"})
	var logged bytes.Buffer
	rep, err := ops.RemoveLetters(ctx, js, matched, ops.ActOptions{Log: zerolog.New(&logged), Actor: "test"})
	if err != nil || rep.Err() != nil || rep.Done != 2 {
		t.Fatalf("remove: %+v, %v", rep, err)
	}
	left := seqsOf(list(t, js, ops.LetterFilter{}))
	if want := []uint64{seqs[1], seqs[3], seqs[4], late}; !slices.Equal(left, want) {
		t.Fatalf("after removing %v the DLQ holds %v, want %v", seqsOf(matched), left, want)
	}
	// Removing again finds them gone, and says so rather than failing.
	rep, err = ops.RemoveLetters(ctx, js, matched, ops.ActOptions{})
	if err != nil || rep.Gone != 2 || rep.Err() != nil {
		t.Fatalf("remove again: %+v, %v", rep, err)
	}
	lines := auditLines(t, &logged)
	if len(lines) != 2 || lines[0]["action"] != "remove" || lines[0]["result"] != "removed" || lines[0]["event_id"] != "rot-h1-1" ||
		lines[0]["worker"] != "credential-h1" || lines[0]["dlq_seq"] != float64(seqs[0]) || lines[0]["actor"] != "test" {
		t.Fatalf("audit lines: %v", lines)
	}
	audits := auditEvents(t, js)
	if len(audits) != 2 || audits[0].Type() != "dev.steward.dlq.removed.v1" {
		t.Fatalf("audit events: %v", audits)
	}
}

func auditLines(t *testing.T, b *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		if m["audit"] == "dlq" {
			out = append(out, m)
		}
	}
	return out
}

// auditEvents are the audit events stored on steward.outcomes.dlq.>.
func auditEvents(t *testing.T, js jetstream.JetStream) []eventOf {
	t.Helper()
	var out []eventOf
	err := streamread.Each(context.Background(), js, streamread.Range{Stream: events.StreamOutcomes, Subjects: []string{events.OutcomesPrefix + ".dlq.>"}}, func(m jetstream.Msg) error {
		e, err := events.Decode(m.Headers(), m.Data())
		if err != nil {
			return err
		}
		out = append(out, eventOf{subject: m.Subject(), Event: e})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

type eventOf struct {
	subject string
	event.Event
}

// TestDLQBulkRetryKeepsPerKeyOrder stores letters out of their events'
// order (a key's later event dead-lettered first, as parallel keys and
// retries make happen), plus a key whose first letter was altered. A bulk
// retry must republish each key's events in the order they were first
// stored, refuse the altered letter, hold the later letter of its key
// (kept, not republished ahead of it), and go on with the other keys.
func TestDLQBulkRetryKeepsPerKeyOrder(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	ctx := context.Background()
	b3 := writeLetter(t, js, letterSpec{"credential", "h1", "h1", 3, 30, "x"})
	a2 := writeLetter(t, js, letterSpec{"credential", "h1", "h2", 2, 20, "x"})
	b1 := writeLetter(t, js, letterSpec{"credential", "h1", "h1", 1, 10, "x"})
	a1 := writeLetter(t, js, letterSpec{"credential", "h1", "h2", 1, 5, "x"})
	// Key h3: its first letter altered after it was written (its data no
	// longer matches its digest), its second whole.
	c1 := forgeAltered(t, js, letterSpec{"credential", "h1", "h3", 1, 7, "x"})
	c2 := writeLetter(t, js, letterSpec{"credential", "h1", "h3", 2, 8, "x"})

	letters := list(t, js, ops.LetterFilter{Worker: "credential-h1"})
	var logged bytes.Buffer
	var seen []uint64
	rep, err := ops.RetryLetters(ctx, js, letters, ops.RetryOptions{Rate: 1000,
		ActOptions: ops.ActOptions{Log: zerolog.New(&logged), Actor: "test", OnResult: func(r ops.Result) { seen = append(seen, r.Sequence) }}})
	if err != nil {
		t.Fatal(err)
	}
	if want := []uint64{a1, c1, c2, b1, a2, b3}; !slices.Equal(seen, want) {
		t.Fatalf("acted in the order %v, want %v (the originals' order)", seen, want)
	}
	if rep.Done != 4 || rep.Refused != 1 || rep.Held != 1 || rep.Err() == nil {
		t.Fatalf("report %+v", rep)
	}
	for _, r := range rep.Results {
		switch r.Sequence {
		case c1:
			if r.Result != ops.ResultRefused || !strings.Contains(r.Error, "left in the DLQ") {
				t.Fatalf("altered letter: %+v", r)
			}
		case c2:
			if r.Result != ops.ResultHeld || !strings.Contains(r.Error, fmt.Sprint(c1)) {
				t.Fatalf("the letter behind it: %+v", r)
			}
		default:
			if r.Result != ops.ResultRetried || !strings.HasPrefix(r.Subject, "steward.events.credential.rotated.") {
				t.Fatalf("letter %d: %+v", r.Sequence, r)
			}
		}
	}
	// The events stream holds each key's events in their first order.
	var ids []string
	err = streamread.Each(ctx, js, streamread.Range{Stream: events.StreamEvents}, func(m jetstream.Msg) error {
		e, err := events.Decode(m.Headers(), m.Data())
		if err != nil {
			return err
		}
		ids = append(ids, e.ID())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"rot-h2-1", "rot-h1-1", "rot-h2-2", "rot-h1-3"}; !slices.Equal(ids, want) {
		t.Fatalf("republished %v, want %v", ids, want)
	}
	if left := seqsOf(list(t, js, ops.LetterFilter{})); !slices.Equal(left, []uint64{c1, c2}) {
		t.Fatalf("the DLQ holds %v, want the refused and the held letter %v", left, []uint64{c1, c2})
	}
	lines := auditLines(t, &logged)
	if len(lines) != 6 {
		t.Fatalf("%d audit lines, want 6", len(lines))
	}
	for _, l := range lines {
		if l["action"] != "retry" || l["dlq_seq"] == nil || l["event_id"] == "" || l["worker"] != "credential-h1" || l["result"] == "" {
			t.Fatalf("audit line %v", l)
		}
		if l["result"] == "retried" && (l["new_seq"] == nil || l["subject"] == nil) {
			t.Fatalf("audit line of a retry lacks where it went: %v", l)
		}
	}
	audits := auditEvents(t, js)
	if len(audits) != 4 {
		t.Fatalf("%d audit events, want one per letter retried", len(audits))
	}
	for _, a := range audits {
		if a.subject != "steward.outcomes.dlq.credential.h1" || a.Type() != "dev.steward.dlq.retried.v1" || a.Extensions()["causationid"] == nil {
			t.Fatalf("audit event on %s: %v", a.subject, a.Event)
		}
	}
}

// forgeAltered writes a letter and changes its data after its digest was
// taken, as someone who may write steward.dlq.> could.
func forgeAltered(t *testing.T, js jetstream.JetStream, s letterSpec) uint64 {
	t.Helper()
	msg := letterMsg(t, s)
	msg.Data = bytes.Replace(msg.Data, []byte(`"client-`), []byte(`"attacker-`), 1)
	msg.Header.Del(nats.MsgIdHdr)
	ack, err := js.PublishMsg(context.Background(), msg)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// TestDLQRetryStopsWhenCancelledAndKeepsTheRest: a slow retry (one letter
// every 1000 seconds) whose operator gives up after the first letter
// stops at once, says so, and leaves the rest in the DLQ.
func TestDLQRetryStopsWhenCancelledAndKeepsTheRest(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	for i := 1; i <= 3; i++ {
		writeLetter(t, js, letterSpec{"credential", "h1", fmt.Sprintf("k%d", i), 1, uint64(i), "x"})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rep, err := ops.RetryLetters(ctx, js, list(t, js, ops.LetterFilter{}), ops.RetryOptions{Rate: 0.001,
		ActOptions: ops.ActOptions{OnResult: func(ops.Result) { cancel() }}})
	if err == nil || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "still in STEWARD_DLQ") {
		t.Fatalf("a cancelled retry: %v", err)
	}
	if rep.Done != 1 || len(list(t, js, ops.LetterFilter{})) != 2 {
		t.Fatalf("report %+v; want one retried, two kept", rep)
	}
}

// TestDLQPurgeAuditsEveryLetter purges the DLQ and proves every letter
// was logged and that the stream is empty; a purge of an empty DLQ does
// nothing.
func TestDLQPurgeAuditsEveryLetter(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	for i := 1; i <= 3; i++ {
		writeLetter(t, js, letterSpec{"credential", "h1", fmt.Sprintf("k%d", i), 1, uint64(i), "x"})
	}
	var logged bytes.Buffer
	rep, err := ops.PurgeLetters(context.Background(), js, ops.ActOptions{Log: zerolog.New(&logged), NoAuditEvents: true})
	if err != nil || rep.Done != 3 {
		t.Fatalf("purge: %+v, %v", rep, err)
	}
	if n := len(list(t, js, ops.LetterFilter{})); n != 0 {
		t.Fatalf("%d letters after the purge", n)
	}
	if lines := auditLines(t, &logged); len(lines) != 3 || lines[2]["result"] != "purged" {
		t.Fatalf("audit lines %v", lines)
	}
	if n := len(auditEvents(t, js)); n != 0 {
		t.Fatalf("%d audit events though NoAuditEvents", n)
	}
	rep, err = ops.PurgeLetters(context.Background(), js, ops.ActOptions{})
	if err != nil || len(rep.Results) != 0 {
		t.Fatalf("purge of an empty DLQ: %+v, %v", rep, err)
	}
}

// TestDLQDetailElidesSecrets: show's view of a letter elides secret-named
// fields and armored blocks in data and headers, and says it is verified.
func TestDLQDetailElidesSecrets(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	seq := writeLetter(t, js, letterSpec{"credential", "h1", "h1", 1, 1, "failed near " + armoredSecret})
	l, err := ops.GetLetter(context.Background(), js, seq, ops.Proofs{})
	if err != nil {
		t.Fatal(err)
	}
	d := ops.Detail(l)
	out, _ := json.Marshal(d)
	if strings.Contains(string(out), "c2VjcmV0") || !strings.Contains(d.Data, `"secret": "[elided]"`) || d.Check != "verified" {
		t.Fatalf("detail: %s", out)
	}
	if _, err := ops.GetLetter(context.Background(), js, 99, ops.Proofs{}); !errors.Is(err, ops.ErrNoLetter) {
		t.Fatalf("GetLetter(99): %v", err)
	}
}

func TestPrintable(t *testing.T) {
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
		if got := ops.Printable(in); got != want {
			t.Errorf("Printable(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestOpsWorkerTable: the console and history read one table.
func TestOpsWorkerTable(t *testing.T) {
	if ops.WorkerOf(events.TypeHostFloorPublished) != "join" || ops.WorkerOf("dev.steward.nothing.v1") != "" {
		t.Fatal("WorkerOf")
	}
	if !slices.Equal(ops.WorkerTypes("credential"), []string{events.TypeCredentialRotated}) || len(ops.WorkerTypes("fifth")) != len(events.Kinds()) {
		t.Fatal("WorkerTypes")
	}
	if !slices.Equal(ops.Workers(), []string{"converge", "credential", "join", "provision"}) {
		t.Fatalf("Workers: %v", ops.Workers())
	}
}
