package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/replay"
	"github.com/steward-dev/steward/workers/workertest"
)

// opsRun runs a command built by mk in this process against url, as the
// root would (its persistent flags are set on g directly).
func opsRun(t *testing.T, url string, mk func(*globals) *cobra.Command, args ...string) (string, string, error) {
	t.Helper()
	return opsRunAs(t, &globals{natsURL: url, replicas: 1, log: zerolog.Nop()}, mk, args...)
}

// opsRunAs is opsRun with the root's settings in g (a --document-key, say).
func opsRunAs(t *testing.T, g *globals, mk func(*globals) *cobra.Command, args ...string) (string, string, error) {
	t.Helper()
	cmd := mk(g)
	var stdout, stderr bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	cmd.SetArgs(args)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	return stdout.String(), stderr.String(), err
}

func opsOK(t *testing.T, url string, mk func(*globals) *cobra.Command, args ...string) string {
	t.Helper()
	out, errOut, err := opsRun(t, url, mk, args...)
	if err != nil {
		t.Fatalf("%v: %v\nstdout:\n%s\nstderr:\n%s", args, err, out, errOut)
	}
	return out
}

func opsCmd(name string) func(*globals) *cobra.Command {
	return func(g *globals) *cobra.Command {
		for _, c := range newOpsCmds(g) {
			if c.Name() == name {
				return c
			}
		}
		panic("no command " + name)
	}
}

func decodeJSON[T any](t *testing.T, raw string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, raw)
	}
	return v
}

const testSecret = "-----BEGIN AGE ENCRYPTED FILE-----\nc2VjcmV0\n-----END AGE ENCRYPTED FILE-----"

func testSpec(hive string) workers.Spec {
	return workers.Spec{Name: "credential", Instance: hive,
		Subjects: []string{events.EventsPrefix + ".credential.rotated." + hive}, Types: []string{events.TypeCredentialRotated}}
}

func publishRotation(t *testing.T, js jetstream.JetStream, hive string, version int) {
	t.Helper()
	e, err := events.New(events.TypeCredentialRotated, hive, events.CredentialRotated{Hive: hive, Version: uint64(version), ClientID: "c", Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	e.SetID(fmt.Sprintf("rot-%s-%d", hive, version))
	e.SetExtension("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	workertest.Publish(t, js, e)
}

// TestOpsStatusCommand proves status names the server on its first line,
// shows a retrying key with its error (secret elided) in the table and the
// JSON, and that a server without Steward's streams is named with the
// setting that chose it.
func TestOpsStatusCommand(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	workertest.Start(t, js, testSpec("h1"), workers.HandlerFunc(func(context.Context, *workers.Delivery) error {
		return fmt.Errorf("disk full \x1b[31mred\x1b[0m, secret %s", testSecret)
	}), workertest.StatusEvery(50*time.Millisecond), workers.WithMaxBackoff(50*time.Millisecond))
	publishRotation(t, js, "h1", 1)
	var out string
	workertest.WaitUntil(t, "status shows the retrying key", func() bool {
		out = opsOK(t, srv.URL(), newStatusCmd)
		return strings.Contains(out, "RETRYING IN")
	})
	first, _, _ := strings.Cut(out, "\n")
	if !strings.HasPrefix(first, "NATS "+srv.URL()) || !strings.Contains(first, "version") {
		t.Fatalf("first line %q does not name the server", first)
	}
	if !strings.Contains(out, "credential-h1") || !strings.Contains(out, "retrying") || !strings.Contains(out, "disk full") {
		t.Fatalf("status:\n%s", out)
	}
	if strings.Contains(out, "c2VjcmV0") || strings.Contains(out, "\x1b") {
		t.Fatalf("status printed a secret or a raw escape:\n%s", out)
	}
	for _, args := range [][]string{{"--json"}, {"-o", "json"}} {
		st := decodeJSON[ops.Status](t, opsOK(t, srv.URL(), newStatusCmd, args...))
		if st.Server != srv.URL() || st.Total != 1 || st.Instances[0].State != ops.StateRetrying || st.Instances[0].Retrying[0].Key != "h1" {
			t.Fatalf("status %v: %+v", args, st)
		}
	}

	empty := workertest.StartServer(t)
	_, _, err := opsRun(t, empty.URL(), newStatusCmd)
	if err == nil || !strings.Contains(err.Error(), empty.URL()) || !strings.Contains(err.Error(), "STEWARD_NATS_URL") {
		t.Fatalf("status on a server without streams: %v", err)
	}
}

// TestOpsStatusSaysWhyLettersWait: an instance with dead letters shows its
// newest letter's reason in the table and the JSON (secret elided), so an
// operator sees why without a second command.
func TestOpsStatusSaysWhyLettersWait(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	w := workertest.Start(t, js, testSpec("h2"), workers.HandlerFunc(func(context.Context, *workers.Delivery) error {
		return workers.Permanent(fmt.Errorf("the hive's folder is gone, ciphertext %s", testSecret))
	}))
	publishRotation(t, js, "h2", 1)
	workertest.WaitIdle(t, js, w.ConsumerName())
	var out string
	workertest.WaitUntil(t, "status shows the newest dead letter's reason", func() bool {
		out = opsOK(t, srv.URL(), newStatusCmd)
		return strings.Contains(out, "LAST DEAD LETTER IN")
	})
	if !strings.Contains(out, "rot-h2-1") || !strings.Contains(out, "the hive's folder is gone") || strings.Contains(out, "c2VjcmV0") {
		t.Fatalf("status:\n%s", out)
	}
	st := decodeJSON[ops.Status](t, opsOK(t, srv.URL(), newStatusCmd, "--json"))
	if l := st.Instances[0].LastDeadLetter; l == nil || l.EventID != "rot-h2-1" || l.Key != "h2" || !strings.Contains(l.Reason, "folder is gone") || strings.Contains(l.Reason, "c2VjcmV0") {
		t.Fatalf("status --json: last dead letter %+v", st.Instances[0].LastDeadLetter)
	}
}

// TestOpsPauseResumeCommands pauses a running worker from the command line,
// proves nothing is delivered while status shows the pause, and that resume
// restarts delivery; both print JSON on request.
func TestOpsPauseResumeCommands(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	var handled atomic.Int64
	w := workertest.Start(t, js, testSpec("h1"), workers.HandlerFunc(func(context.Context, *workers.Delivery) error {
		handled.Add(1)
		return nil
	}))
	out := opsOK(t, srv.URL(), opsCmd("pause"), "credential", "h1", "--until", "1h")
	if !strings.Contains(out, "paused credential-h1 until ") {
		t.Fatalf("pause printed %q", out)
	}
	p := decodeJSON[ops.Paused](t, opsOK(t, srv.URL(), opsCmd("pause"), "credential", "h1", "--json"))
	if !p.Paused || p.Until == nil || p.Until.Before(time.Now().Add(24*time.Hour)) {
		t.Fatalf("pause without --until: %+v", p)
	}
	publishRotation(t, js, "h1", 1)
	workertest.WaitUntil(t, "status shows the instance paused with its event pending and its pull waiting", func() bool {
		st := decodeJSON[ops.Status](t, opsOK(t, srv.URL(), newStatusCmd, "-o", "json"))
		in := st.Instances[0]
		return in.State == ops.StatePaused && in.Pending == 1 && in.PullsWaiting > 0
	})
	if handled.Load() != 0 {
		t.Fatal("an event was handled while paused")
	}
	if table := opsOK(t, srv.URL(), newStatusCmd); !strings.Contains(table, "paused") {
		t.Fatalf("status table:\n%s", table)
	}
	r := decodeJSON[ops.Paused](t, opsOK(t, srv.URL(), opsCmd("resume"), "credential", "h1", "-o", "json"))
	if r.Paused || r.Consumer != w.ConsumerName() {
		t.Fatalf("resume: %+v", r)
	}
	workertest.WaitUntil(t, "the event is handled after resume", func() bool { return handled.Load() == 1 })
	if out := opsOK(t, srv.URL(), opsCmd("resume"), "credential", "h1"); !strings.Contains(out, "resumed credential-h1") {
		t.Fatalf("resume printed %q", out)
	}
	if _, _, err := opsRun(t, srv.URL(), opsCmd("pause"), "credential", "h1", "--until", "yesterday"); err == nil || !strings.Contains(err.Error(), "--until") {
		t.Fatalf("bad --until: %v", err)
	}
}

// TestOpsHistoryCommand proves history prints a key's event and outcome with
// ids and the trace id, in the table and as JSON.
func TestOpsHistoryCommand(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	publishRotation(t, js, "h1", 1)
	w := workertest.Start(t, js, testSpec("h1"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		return d.Emit(ctx, "applied", map[string]any{"version": 1})
	}))
	workertest.WaitIdle(t, js, w.ConsumerName())
	workertest.WaitUntil(t, "the outcome is stored", func() bool { return len(workertest.Outcomes(t, js, "credential", "h1")) == 1 })
	out := opsOK(t, srv.URL(), opsCmd("history"), "credential", "h1")
	for _, want := range []string{"history of key h1 for worker credential on " + srv.URL(), "rot-h1-1", "outcome applied", "credential-h1-1", "4bf92f3577b34da6a3ce929d0e0e4736"} {
		if !strings.Contains(out, want) {
			t.Fatalf("history lacks %q:\n%s", want, out)
		}
	}
	h := decodeJSON[ops.History](t, opsOK(t, srv.URL(), opsCmd("history"), "credential", "h1", "--json"))
	if len(h.Entries) != 2 || h.Entries[1].CausationID != "rot-h1-1" || h.Entries[0].TraceID == "" {
		t.Fatalf("history JSON %+v", h)
	}
}

// TestOpsHistoryShowsRuleAndReason proves a refused outcome's rule and
// reason are in history's REASON column and its JSON, secrets elided and
// control characters escaped, and a dead letter's error beside it.
func TestOpsHistoryShowsRuleAndReason(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	publishRotation(t, js, "h1", 1)
	publishRotation(t, js, "h1", 2)
	w := workertest.Start(t, js, testSpec("h1"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		if d.Event.ID() == "rot-h1-2" {
			return workers.Permanent(fmt.Errorf("the hive's folder is gone"))
		}
		if err := d.Emit(ctx, "refused", map[string]string{"rule": "downgrade", "reason": "version 1 is older than the installed 2 \x1b[31m" + testSecret}); err != nil {
			return err
		}
		return workers.Refused(fmt.Errorf("refused (downgrade)"))
	}))
	workertest.WaitIdle(t, js, w.ConsumerName())
	workertest.WaitUntil(t, "the dead letter is stored", func() bool { return len(workertest.DeadLetters(t, js, "credential", "h1")) == 1 })

	out := opsOK(t, srv.URL(), opsCmd("history"), "credential", "h1")
	for _, want := range []string{"REASON", "downgrade: version 1 is older than the installed 2 \\x1b[31m[elided]", "the hive's folder is gone"} {
		if !strings.Contains(out, want) {
			t.Errorf("history lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b") || strings.Contains(out, "c2VjcmV0") {
		t.Errorf("history prints a control character or the secret:\n%s", out)
	}
	h := decodeJSON[ops.History](t, opsOK(t, srv.URL(), opsCmd("history"), "credential", "h1", "--json"))
	var refused ops.Entry
	for _, e := range h.Entries {
		if e.Outcome == "refused" {
			refused = e
		}
	}
	if refused.Rule != "downgrade" || !strings.HasPrefix(refused.Reason, "version 1 is older") {
		t.Fatalf("history JSON's refused entry %+v, want rule and reason", refused)
	}
}

// TestOpsConsumersCommand lists Steward's consumers, removes a left-over
// one, refuses a consumed one and prints JSON.
func TestOpsConsumersCommand(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	workertest.Start(t, js, testSpec("live"), workers.HandlerFunc(func(context.Context, *workers.Delivery) error { return nil }))
	if _, err := js.CreateOrUpdateConsumer(context.Background(), events.StreamEvents, jetstream.ConsumerConfig{
		Durable: "credential-left", Description: "Steward credential worker for left", FilterSubjects: testSpec("left").Subjects}); err != nil {
		t.Fatal(err)
	}
	out := opsOK(t, srv.URL(), opsCmd("consumers"), "ls")
	if !strings.Contains(out, "credential-live") || !strings.Contains(out, "credential-left") {
		t.Fatalf("consumers ls:\n%s", out)
	}
	list := decodeJSON[[]ops.Consumer](t, opsOK(t, srv.URL(), opsCmd("consumers"), "ls", "--json"))
	if len(list) != 2 {
		t.Fatalf("consumers ls --json: %+v", list)
	}
	if _, _, err := opsRun(t, srv.URL(), opsCmd("consumers"), "rm", "credential-live"); err == nil || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("rm of a consumed consumer: %v", err)
	}
	rm := decodeJSON[[]ops.Consumer](t, opsOK(t, srv.URL(), opsCmd("consumers"), "rm", "credential-left", "-o", "json"))
	if len(rm) != 1 || rm[0].Name != "credential-left" {
		t.Fatalf("rm --json: %+v", rm)
	}
}

// TestOpsVersionCommand prints the versions, with the server's when
// connected, and says why there is none otherwise.
func TestOpsVersionCommand(t *testing.T) {
	srv := workertest.StartServer(t)
	out := opsOK(t, srv.URL(), opsCmd("version"))
	if !strings.Contains(out, "nats.go") || !strings.Contains(out, "go1.") || !strings.Contains(out, "nats server") {
		t.Fatalf("version:\n%s", out)
	}
	v := decodeJSON[ops.Version](t, opsOK(t, srv.URL(), opsCmd("version"), "--json"))
	if v.Server == nil || v.Server.Version == "" || v.NATSClient == "" || v.Go == "" {
		t.Fatalf("version JSON %+v", v)
	}
	off := decodeJSON[ops.Version](t, opsOK(t, srv.URL(), opsCmd("version"), "--json", "--offline"))
	if off.Server != nil {
		t.Fatalf("--offline asked the server: %+v", off.Server)
	}
}

// TestOpsExportLeavesOutBrokenEvent stores an event whose data is not JSON
// among good ones and proves export reports it on stderr and writes the
// others.
func TestOpsExportLeavesOutBrokenEvent(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	publishRotation(t, js, "h1", 1)
	broken, err := events.New(events.TypeCredentialRotated, "h1", events.CredentialRotated{Hive: "h1", Version: 2, ClientID: "c", Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	broken.SetID("broken")
	broken.SetSource("/test")
	msg, err := events.Encode("steward.events.credential.rotated.h1", broken)
	if err != nil {
		t.Fatal(err)
	}
	msg.Data = []byte(`{"hive":"h1",`) // cut short
	if _, err := js.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	publishRotation(t, js, "h1", 3)
	file := filepath.Join(t.TempDir(), "out.jsonl")
	_, stderr, err := opsRun(t, srv.URL(), newExportCmd, "--out", file)
	if err != nil {
		t.Fatalf("export: %v\n%s", err, stderr)
	}
	if !strings.Contains(stderr, "seq 2 on steward.events.credential.rotated.h1 is left out") || !strings.Contains(stderr, "exported 2 events") {
		t.Fatalf("export stderr:\n%s", stderr)
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if got := exportedIDs(t, string(raw)); got != "rot-h1-1,rot-h1-3" {
		t.Fatalf("exported %s", got)
	}
}

// TestOpsReplayCountsAndMarks proves replay counts by the runtime's rules
// (applied, unchanged by a skipped outcome, refused, would be
// dead-lettered, failed), marks its outcomes, prints a JSON report, and
// that --dry-run creates no consumer.
func TestOpsReplayCountsAndMarks(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	cfg, flags := credentialFixture(t)
	url := "--nats-url=" + srv.URL()
	secretFile := filepath.Join(t.TempDir(), "s")
	if err := os.WriteFile(secretFile, []byte("replayed-secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, v := range []int{2, 1} {
		ok(t, nil, "publish", url, "--type", events.TypeCredentialRotated,
			"--data", fmt.Sprintf(`{"hive":"%s","version":%d,"clientId":"client-%d"}`, cfg.Hive, v, v),
			"--secret-file", secretFile, "--recipient", recipientOf(t, cfg.AgeIdentity), "--signing-key", signingKeyOf(cfg))
	}
	ctx := context.Background()
	if _, err := js.KeyValue(ctx, events.CheckpointBucket); err != nil {
		if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: events.CheckpointBucket}); err != nil {
			t.Fatal(err)
		}
	}

	// One old invalid event (published before a schema check, say) is
	// reported, and fails no replay for as long as the stream keeps it.
	bad := nats.NewMsg(events.EventsPrefix + ".credential.rotated." + cfg.Hive)
	for k, v := range map[string]string{"ce-specversion": "1.0", "ce-type": events.TypeCredentialRotated, "ce-source": "/old",
		"ce-id": "old-invalid", "ce-subject": cfg.Hive, "content-type": "application/json"} {
		bad.Header.Set(k, v)
	}
	bad.Data = []byte(`{"hive":"` + cfg.Hive + `","version":"one"}`)
	if _, err := js.PublishMsg(context.Background(), bad); err != nil {
		t.Fatal(err)
	}

	out := opsOK(t, srv.URL(), newReplayCmd, append([]string{"credential", "--dry-run"}, flags...)...)
	if !strings.Contains(out, "3 events, 2 would be handled, 1 invalid") {
		t.Fatalf("dry run:\n%s", out)
	}
	if _, err := js.Consumer(ctx, events.StreamEvents, "credential-"+cfg.Hive); err == nil {
		t.Fatal("replay --dry-run created the worker's durable consumer")
	}

	// Version 2 applies; version 1, older, is refused by the handler's
	// rules (its outcome says skipped).
	out = opsOK(t, srv.URL(), newReplayCmd, append([]string{"credential"}, flags...)...)
	if !strings.Contains(out, "replayed 3 events through credential-"+cfg.Hive+": 1 applied, 0 failed, 0 unchanged, 1 refused") || !strings.Contains(out, "1 invalid") ||
		!strings.Contains(out, "refused (outcomes: skipped)") {
		t.Fatalf("replay:\n%s", out)
	}
	// Replayed again, neither changes anything: the report says so rather
	// than "2 applied".
	raw := opsOK(t, srv.URL(), newReplayCmd, append([]string{"credential", "--json"}, flags...)...)
	rep := decodeJSON[replayReport](t, raw)
	if rep.Total != 3 || rep.Counts[replay.Applied] != 0 || len(rep.Events) != 3 || rep.Events[0].Outcomes[0] != "skipped" {
		t.Fatalf("replay --json:\n%s", raw)
	}
	if _, err := js.Consumer(ctx, events.StreamEvents, "credential-"+cfg.Hive); err == nil {
		t.Fatal("replay created the worker's durable consumer")
	}
	outcomes := workertest.Outcomes(t, js, "credential", cfg.Hive)
	if len(outcomes) != 4 {
		t.Fatalf("%d outcomes stored, want 4 (two replays of two events, none deduplicated away)", len(outcomes))
	}
	for _, o := range outcomes {
		if o.Extensions()[events.ReplayExtension] != true && o.Extensions()[events.ReplayExtension] != "true" {
			t.Fatalf("outcome %s is not marked as replayed: %v", o.ID(), o.Extensions())
		}
	}
	h := decodeJSON[ops.History](t, opsOK(t, srv.URL(), opsCmd("history"), "credential", cfg.Hive, "--json"))
	replayed := 0
	for _, e := range h.Entries {
		if e.Replay {
			replayed++
		}
	}
	if replayed != 4 {
		t.Fatalf("history marks %d outcomes as replayed, want 4", replayed)
	}
}

// TestReplayVerdicts checks the runtime's result rules on a replay, with a
// handler for each.
func TestReplayVerdicts(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	for v := 1; v <= 4; v++ {
		publishRotation(t, js, "h1", v)
	}
	ctx := context.Background()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: events.CheckpointBucket}); err != nil {
		t.Fatal(err)
	}
	h := workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		var r events.CredentialRotated
		if err := d.DataAs(&r); err != nil {
			return err
		}
		switch r.Version {
		case 1:
			return nil
		case 2:
			return workers.Refused(fmt.Errorf("stale"))
		case 3:
			return workers.Permanent(fmt.Errorf("broken"))
		}
		return fmt.Errorf("try later")
	})
	r, err := replay.New(ctx, js, testSpec("h1"), h)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	var total uint64
	if err := r.Replay(ctx, replay.From{}, false, func(n uint64) { total = n }, func(res replay.Result) {
		got = append(got, res.Verdict)
	}); err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "applied,refused,dead-letter,failed" || total != 4 {
		t.Fatalf("verdicts %v, total %d", got, total)
	}
	if len(workertest.DeadLetters(t, js, "credential", "h1")) != 0 {
		t.Fatal("a replay wrote a dead letter")
	}
}

// TestProgressReporter proves nothing is printed within the first second,
// lines at most every progressInterval off a terminal, and a counter
// redrawn in place on one.
func TestProgressReporter(t *testing.T) {
	start := time.Unix(1000, 0)
	var lines bytes.Buffer
	p := newProgress(&lines, "exported", false, start)
	p.setTotal(200)
	p.add(50)
	p.tick(start.Add(900 * time.Millisecond))
	if lines.Len() != 0 {
		t.Fatalf("printed within a second: %q", lines.String())
	}
	p.tick(start.Add(1100 * time.Millisecond))
	p.add(50)
	p.tick(start.Add(2 * time.Second))
	p.tick(start.Add(6200 * time.Millisecond))
	p.finish()
	want := "exported 50 of 200 (25%), 1s, 45/s\nexported 100 of 200 (50%), 6s, 16/s\n"
	if lines.String() != want {
		t.Fatalf("lines %q, want %q", lines.String(), want)
	}
	var term bytes.Buffer
	q := newProgress(&term, "published", true, start)
	q.add(3)
	q.tick(start.Add(1500 * time.Millisecond))
	q.finish()
	if !strings.HasPrefix(term.String(), "\r\x1b[Kpublished 3, 2s") || !strings.HasSuffix(term.String(), "\n") {
		t.Fatalf("terminal %q", term.String())
	}
}

// TestOutputEscapesControlCharacters proves table cells cannot carry
// terminal controls, and -o takes only table or json.
func TestOutputEscapesControlCharacters(t *testing.T) {
	var b bytes.Buffer
	tb := newTable(&b, "A", "B")
	tb.row("key\x1b]52;c;evil\x07", "two\nlines\u202e")
	if err := tb.flush(); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(b.String(), "\x1b\x07\u202e") || !strings.Contains(b.String(), `key\x1b]52;c;evil\x07`) || !strings.Contains(b.String(), `two\x0alines\u202e`) {
		t.Fatalf("table %q", b.String())
	}
	o := &outputFlags{format: "yaml"}
	if _, err := o.asJSON(); err == nil {
		t.Fatal("-o yaml accepted")
	}
}

// TestOpsHistoryFollow proves history --follow --json prints the stored
// entries, then each one stored afterwards as one JSON line, and ends
// cleanly when its context is cancelled (Ctrl-C).
func TestOpsHistoryFollow(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	publishRotation(t, js, "h1", 1)
	g := &globals{natsURL: srv.URL(), replicas: 1, log: zerolog.Nop()}
	cmd := opsCmd("history")(g)
	var stdout workertest.Logs
	cmd.SetOut(&stdout)
	cmd.SetErr(io.Discard)
	cmd.SetArgs([]string{"credential", "h1", "--follow", "--json"})
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()

	lines := func() []ops.Entry {
		var out []ops.Entry
		for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
			if l == "" {
				continue
			}
			var e ops.Entry
			if err := json.Unmarshal([]byte(l), &e); err != nil {
				t.Fatalf("--follow --json line %q is not one JSON entry: %v", l, err)
			}
			out = append(out, e)
		}
		return out
	}
	workertest.WaitUntil(t, "the stored event is printed", func() bool { return len(lines()) == 1 })
	publishRotation(t, js, "h1", 2)
	w := workertest.Start(t, js, testSpec("h1"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		if err := d.Emit(ctx, "refused", map[string]string{"rule": "stale", "reason": "not above the applied version"}); err != nil {
			return err
		}
		return workers.Refused(fmt.Errorf("refused (stale)"))
	}))
	workertest.WaitIdle(t, js, w.ConsumerName())
	workertest.WaitUntil(t, "the new event and both refusals are printed", func() bool { return len(lines()) == 4 })
	got := lines()
	if got[0].ID != "rot-h1-1" || got[1].ID != "rot-h1-2" || got[2].Rule != "stale" || got[3].CausationID != "rot-h1-2" {
		t.Fatalf("followed %+v", got)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("history --follow ended with %v, want nil when interrupted", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("history --follow did not end when its context was cancelled")
	}
}
