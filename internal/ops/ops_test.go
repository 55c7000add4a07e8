package ops_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

const armoredSecret = "-----BEGIN AGE ENCRYPTED FILE-----\nc2VjcmV0\n-----END AGE ENCRYPTED FILE-----"

func credSpec(hive string) workers.Spec {
	return workers.Spec{Name: "credential", Instance: hive,
		Subjects: []string{events.EventsPrefix + ".credential.rotated." + hive},
		Types:    []string{events.TypeCredentialRotated}}
}

func rotation(hive string, version int) events.CredentialRotated {
	return events.CredentialRotated{Hive: hive, Version: uint64(version), ClientID: fmt.Sprintf("client-%d", version), Secret: armoredSecret}
}

// publishTraced publishes a rotation with a traceparent extension.
func publishTraced(t *testing.T, js jetstream.JetStream, hive string, version int, trace string) string {
	t.Helper()
	e, err := events.New(events.TypeCredentialRotated, hive, rotation(hive, version))
	if err != nil {
		t.Fatal(err)
	}
	e.SetID(fmt.Sprintf("rot-%s-%d", hive, version))
	if trace != "" {
		e.SetExtension("traceparent", "00-"+trace+"-00f067aa0ba902b7-01")
	}
	workertest.Publish(t, js, e)
	return e.ID()
}

func statusOf(t *testing.T, js jetstream.JetStream, o ops.StatusOptions) *ops.Status {
	t.Helper()
	st, err := ops.GetStatus(context.Background(), js, o)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func instanceOf(t *testing.T, st *ops.Status, name string) ops.Instance {
	t.Helper()
	for _, in := range st.Instances {
		if in.Name == name {
			return in
		}
	}
	t.Fatalf("status lists no instance %s: %+v", name, st.Instances)
	return ops.Instance{}
}

// TestStatusRetryingKeysWithSecretsElided runs a worker whose handler fails
// with an error quoting an armored secret, and proves status names the key,
// its attempt, first failure and last error with the secret elided, says
// the instance is consuming, and counts it as retrying.
func TestStatusRetryingKeysWithSecretsElided(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	h := workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		var r events.CredentialRotated
		if err := d.DataAs(&r); err != nil {
			return err
		}
		return fmt.Errorf("the credential folder is read-only; secret was %s", r.Secret)
	})
	w := workertest.Start(t, js, credSpec("h1"), h, workertest.StatusEvery(50*time.Millisecond), workers.WithMaxBackoff(50*time.Millisecond))
	publishTraced(t, js, "h1", 1, "")

	var in ops.Instance
	workertest.WaitUntil(t, "status shows h1's key retrying", func() bool {
		st := statusOf(t, js, ops.StatusOptions{})
		for _, i := range st.Instances {
			if i.Name == w.ConsumerName() && len(i.Retrying) > 0 && i.Retrying[0].Attempt >= 2 {
				in = i
				return st.Counts[ops.StateRetrying] == 1
			}
		}
		return false
	})
	r := in.Retrying[0]
	if in.State != ops.StateRetrying || !in.Consuming || !in.HasConsumer || r.Key != "h1" || r.EventID != "rot-h1-1" || r.FirstFailure.IsZero() {
		t.Fatalf("instance %+v", in)
	}
	if strings.Contains(r.LastError, "c2VjcmV0") || !strings.Contains(r.LastError, "read-only") {
		t.Fatalf("last error %q: want the reason without the secret", r.LastError)
	}
	if in.AckPending != 1 || in.OldestPending == nil || in.OldestPendingSeconds < 0 {
		t.Fatalf("pending %d, oldest %v (%vs)", in.AckPending, in.OldestPending, in.OldestPendingSeconds)
	}
	raw, _ := json.Marshal(statusOf(t, js, ops.StatusOptions{}))
	if strings.Contains(string(raw), "c2VjcmV0") {
		t.Fatalf("status JSON holds the secret: %s", raw)
	}
}

// TestStatusAtFleetSize creates many instances' consumers and status
// documents and proves status counts them by state, lists the worst first,
// pages the rest, filters by worker and instance, reports waiting keys and
// dead letters, and asks the server for no consumer's info one by one.
func TestStatusAtFleetSize(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	ctx := context.Background()
	const n = 60
	for i := range n {
		hive := fmt.Sprintf("h%02d", i)
		_, err := js.CreateOrUpdateConsumer(ctx, events.StreamEvents, jetstream.ConsumerConfig{
			Durable: ops.ConsumerName("credential", hive), Description: "Steward credential worker for " + hive,
			FilterSubjects: credSpec(hive).Subjects, AckPolicy: jetstream.AckExplicitPolicy,
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Nobody consumes them: h05 has an event pending (stalled), h07 is
	// waiting behind an earlier event, h09 has a dead letter.
	publishTraced(t, js, "h05", 1, "")
	kv, err := js.KeyValue(ctx, events.CheckpointBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: events.CheckpointBucket})
	}
	if err != nil {
		t.Fatal(err)
	}
	doc, _ := json.Marshal(events.Status{Worker: "credential", Instance: "h07", Process: "host-1", UpdatedAt: time.Now(),
		Retrying: []events.RetryingKey{}, Waiting: []events.WaitingKey{{Key: "h07", EventID: "rot-h07-2", Sequence: 9, Behind: 4, Since: time.Now()}}})
	if _, err := kv.Put(ctx, events.StatusKey("credential", "h07"), doc); err != nil {
		t.Fatal(err)
	}
	letter, _ := events.NewDeadLetter(events.LetterSource{Consumer: "credential-h09", DLQSubject: events.DLQSubject("credential", "h09"),
		Stream: events.StreamEvents, Sequence: 1, Subject: "steward.events.credential.rotated.h09", Delivered: 1, Reason: "undecodable",
		Header: nats.Header{"ce-id": []string{"x"}}, Data: []byte("{")})
	if _, err := js.PublishMsg(ctx, letter); err != nil {
		t.Fatal(err)
	}

	// Count the consumer info requests status makes.
	var infos atomic.Int64
	sub, err := js.Conn().Subscribe("$JS.API.CONSUMER.INFO.>", func(*nats.Msg) { infos.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := js.Conn().Flush(); err != nil {
		t.Fatal(err)
	}

	st := statusOf(t, js, ops.StatusOptions{Limit: 5})
	if st.Total != n || len(st.Instances) != 5 || st.More != n-5 {
		t.Fatalf("total %d, shown %d, more %d", st.Total, len(st.Instances), st.More)
	}
	if st.Instances[0].Name != "credential-h05" || st.Instances[0].State != ops.StateStalled || st.Instances[0].OldestPending == nil {
		t.Fatalf("worst instance %+v, want credential-h05 stalled with its oldest pending age", st.Instances[0])
	}
	if st.Instances[1].Name != "credential-h07" || st.Instances[1].State != ops.StateWaiting || st.Instances[1].Waiting[0].Behind != 4 {
		t.Fatalf("second instance %+v, want credential-h07 waiting", st.Instances[1])
	}
	if st.Instances[2].Name != "credential-h09" || st.Instances[2].State != ops.StateDeadLetters || st.DeadLetters != 1 {
		t.Fatalf("third instance %+v, want credential-h09 with a dead letter", st.Instances[2])
	}
	if c := st.Counts; c[ops.StateStalled] != 1 || c[ops.StateWaiting] != 1 || c[ops.StateDeadLetters] != 1 || c[ops.StateNotConsuming] != n-3 {
		t.Fatalf("counts %v", c)
	}
	if err := js.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	if got := infos.Load(); got != 0 {
		t.Fatalf("status made %d consumer info requests; want none (one paged listing)", got)
	}

	one := statusOf(t, js, ops.StatusOptions{Instance: "h07"})
	if one.Total != 1 || one.Instances[0].Name != "credential-h07" {
		t.Fatalf("--instance h07: %+v", one.Instances)
	}
	if other := statusOf(t, js, ops.StatusOptions{Worker: "provision"}); other.Total != 0 {
		t.Fatalf("--worker provision matched %d", other.Total)
	}
	if all := statusOf(t, js, ops.StatusOptions{Limit: -1}); len(all.Instances) != n || all.More != 0 {
		t.Fatalf("limit -1 listed %d", len(all.Instances))
	}
}

// TestPauseStopsDeliveryAndResumeRestartsIt pauses a running worker's
// consumer, proves an event published meanwhile stays pending while the
// worker's pull waits at the server, that status shows the pause, and that
// resuming delivers it to the pull that waited (ops.wakeConsumer).
func TestPauseStopsDeliveryAndResumeRestartsIt(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	ctx := context.Background()
	var handled atomic.Int64
	var handledAt atomic.Pointer[time.Time]
	w := workertest.Start(t, js, credSpec("h1"), workers.HandlerFunc(func(context.Context, *workers.Delivery) error {
		now := time.Now()
		handledAt.Store(&now)
		handled.Add(1)
		return nil
	}))
	until := time.Now().Add(time.Hour)
	p, err := ops.Pause(ctx, js, nil, "credential", "h1", until)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Paused || p.Until == nil || p.Consumer != w.ConsumerName() {
		t.Fatalf("pause returned %+v", p)
	}
	publishTraced(t, js, "h1", 1, "")
	workertest.WaitUntil(t, "the event is pending at the paused consumer while the worker's pull waits", func() bool {
		in := instanceOf(t, statusOf(t, js, ops.StatusOptions{}), w.ConsumerName())
		return in.State == ops.StatePaused && in.Pending == 1 && in.PullsWaiting > 0 && in.PausedUntil != nil
	})
	if n := handled.Load(); n != 0 {
		t.Fatalf("the handler ran %d times while paused", n)
	}
	resumed := time.Now()
	r, err := ops.Resume(ctx, js, nil, "credential", "h1")
	if err != nil || r.Paused {
		t.Fatalf("resume: %+v, %v", r, err)
	}
	workertest.WaitUntil(t, "the handler runs once resumed", func() bool { return handled.Load() == 1 })
	// A measurement, not a pass mark (the machine is shared): the held
	// event is applied well within a second of the resume, where the
	// worker's pull used to wait out its 30 s expiry.
	t.Logf("the held event was handled %v after steward resume was called", handledAt.Load().Sub(resumed).Round(time.Millisecond))
	workertest.WaitIdle(t, js, w.ConsumerName())
	if in := instanceOf(t, statusOf(t, js, ops.StatusOptions{}), w.ConsumerName()); in.State != ops.StateOK || in.PausedUntil != nil {
		t.Fatalf("after resume: %+v", in)
	}
	if _, err := ops.Pause(ctx, js, nil, "credential", "nobody", until); err == nil || !strings.Contains(err.Error(), "steward status") {
		t.Fatalf("pausing a missing instance: %v", err)
	}
}

// TestHistoryOfOneKey proves a key's history holds its events, the
// outcomes and dead letters they caused, in order, with ids, times, trace
// ids and causation, and leaves other keys out.
func TestHistoryOfOneKey(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	// Published before the worker starts, so the order is fixed: both
	// events, then what the worker did with each.
	trace := "4bf92f3577b34da6a3ce929d0e0e4736"
	first := publishTraced(t, js, "h1", 1, trace)
	second := publishTraced(t, js, "h1", 2, "")
	publishTraced(t, js, "h2", 1, "") // another key, no worker
	w := workertest.Start(t, js, credSpec("h1"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		var r events.CredentialRotated
		if err := d.DataAs(&r); err != nil {
			return err
		}
		if r.Version == 2 {
			return workers.Permanent(errors.New("the hive's folder is gone"))
		}
		return d.Emit(ctx, "applied", map[string]any{"version": r.Version})
	}))
	workertest.WaitIdle(t, js, w.ConsumerName())
	workertest.WaitUntil(t, "the dead letter is stored", func() bool { return len(workertest.DeadLetters(t, js, "credential", "h1")) == 1 })

	h, err := ops.GetHistory(context.Background(), js, ops.HistoryOptions{Worker: "credential", Key: "h1"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range h.Entries {
		got = append(got, e.Kind+":"+e.ID)
	}
	want := []string{"event:" + first, "event:" + second, "outcome:credential-h1-1", "dead-letter:" + second}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("history %v, want %v", got, want)
	}
	ev, out, dead := h.Entries[0], h.Entries[2], h.Entries[3]
	if ev.TraceID != trace || ev.Sequence != 1 || ev.Time.IsZero() || ev.Type != events.TypeCredentialRotated {
		t.Fatalf("event entry %+v", ev)
	}
	if out.CausationID != first || out.Outcome != "applied" || out.Instance != "h1" || out.Replay {
		t.Fatalf("outcome entry %+v", out)
	}
	if dead.CausationID != second || !strings.Contains(dead.Reason, "folder is gone") {
		t.Fatalf("dead letter entry %+v", dead)
	}
	if _, err := ops.GetHistory(context.Background(), js, ops.HistoryOptions{Worker: "credential", Key: "no.such.key"}); err == nil {
		t.Fatal("a key no event can have was accepted")
	}
}

// TestConsumersListAndRemove proves only Steward's consumers are removed,
// a consumed one only with force.
func TestConsumersListAndRemove(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	ctx := context.Background()
	w := workertest.Start(t, js, credSpec("live"), workers.HandlerFunc(func(context.Context, *workers.Delivery) error { return nil }))
	for _, cfg := range []jetstream.ConsumerConfig{
		{Durable: "credential-left", Description: "Steward credential worker for left", FilterSubjects: credSpec("left").Subjects},
		{Durable: "someone-elses", Description: "audit tap"},
	} {
		if _, err := js.CreateOrUpdateConsumer(ctx, events.StreamEvents, cfg); err != nil {
			t.Fatal(err)
		}
	}
	list, err := ops.Consumers(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]ops.Consumer{}
	for _, c := range list {
		byName[c.Name] = c
	}
	if c := byName[w.ConsumerName()]; !c.Steward || !c.Consuming || c.Worker != "credential" || c.Instance != "live" {
		t.Fatalf("live consumer %+v", c)
	}
	if c := byName["someone-elses"]; c.Steward {
		t.Fatalf("a foreign consumer is listed as Steward's: %+v", c)
	}
	if _, err := ops.RemoveConsumer(ctx, js, "someone-elses", true); err == nil || !strings.Contains(err.Error(), "not created by Steward") {
		t.Fatalf("removing a foreign consumer: %v", err)
	}
	if _, err := ops.RemoveConsumer(ctx, js, w.ConsumerName(), false); !errors.Is(err, ops.ErrConsuming) {
		t.Fatalf("removing a consumed consumer without force: %v", err)
	}
	if _, err := ops.RemoveConsumer(ctx, js, "credential-left", false); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Consumer(ctx, events.StreamEvents, "credential-left"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("after rm: %v", err)
	}
}

// TestNoStreamsNamesTheServer proves a server without Steward's streams is
// reported by its URL.
func TestNoStreamsNamesTheServer(t *testing.T) {
	srv := workertest.StartServer(t)
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	_, err = ops.GetStatus(context.Background(), js, ops.StatusOptions{})
	var none *ops.NoStreamsError
	if !errors.As(err, &none) || !strings.Contains(err.Error(), strings.TrimPrefix(srv.URL(), "nats://")) {
		t.Fatalf("status on an empty server: %v", err)
	}
}

// TestHistoryNamesTheRuleAndReason proves every superseded and refused
// outcome and every dead letter in a key's history says why: the rule and
// reason of a refusal (its secret elided), the event that superseded an
// event, a dead letter's error.
func TestHistoryNamesTheRuleAndReason(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	// Published before the worker starts, so versions 1 and 2 are queued
	// behind each other and superseded by 3.
	for v := 1; v <= 3; v++ {
		publishTraced(t, js, "h1", v, "")
	}
	spec := credSpec("h1")
	spec.Rank = func(_ context.Context, d *workers.Delivery) (uint64, error) {
		var r events.CredentialRotated
		err := d.DataAs(&r)
		return r.Version, err
	}
	w := workertest.Start(t, js, spec, workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		var r events.CredentialRotated
		if err := d.DataAs(&r); err != nil {
			return err
		}
		if r.Version == 4 {
			return workers.Permanent(errors.New("the hive's folder is gone"))
		}
		if err := d.Emit(ctx, "refused", map[string]string{"rule": "signature", "reason": "the rotation does not verify:\n" + r.Secret}); err != nil {
			return err
		}
		return workers.Refused(errors.New("refused (signature)"))
	}))
	workertest.WaitIdle(t, js, w.ConsumerName())
	publishTraced(t, js, "h1", 4, "")
	workertest.WaitUntil(t, "the dead letter is stored", func() bool { return len(workertest.DeadLetters(t, js, "credential", "h1")) == 1 })

	h, err := ops.GetHistory(context.Background(), js, ops.HistoryOptions{Worker: "credential", Key: "h1"})
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]ops.Entry{}
	for _, e := range h.Entries {
		if e.Kind != ops.EntryEvent {
			by[e.CausationID] = e
		}
	}
	for _, v := range []string{"rot-h1-1", "rot-h1-2"} {
		if e := by[v]; e.Outcome != "superseded" || e.SupersededBy != "rot-h1-3" || !strings.Contains(e.Reason, "superseded by rot-h1-3") {
			t.Errorf("outcome of %s: %+v, want superseded by rot-h1-3 with the reason", v, e)
		}
	}
	if e := by["rot-h1-3"]; e.Outcome != "refused" || e.Rule != "signature" || !strings.Contains(e.Reason, "does not verify: [elided]") || strings.Contains(e.Reason, "c2VjcmV0") {
		t.Errorf("outcome of rot-h1-3: %+v, want rule signature and the reason on one line, secret elided", e)
	}
	if e := by["rot-h1-4"]; e.Kind != ops.EntryDeadLetter || !strings.Contains(e.Reason, "folder is gone") {
		t.Errorf("dead letter of rot-h1-4: %+v", e)
	}
	raw, _ := json.Marshal(h)
	for _, field := range []string{`"rule":"signature"`, `"supersededBy":"rot-h1-3"`} {
		if !strings.Contains(string(raw), field) {
			t.Errorf("history JSON lacks %s: %s", field, raw)
		}
	}
}

// TestFollowHistoryShowsWhatIsStoredNext reads a key's history, follows it,
// and proves the events and outcomes stored afterwards come once each and
// in order, another key's never, and that cancelling ends the follow.
func TestFollowHistoryShowsWhatIsStoredNext(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	first := publishTraced(t, js, "h1", 1, "")
	h, err := ops.GetHistory(context.Background(), js, ops.HistoryOptions{Worker: "credential", Key: "h1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Entries) != 1 || h.Entries[0].ID != first {
		t.Fatalf("history before following: %+v", h.Entries)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan ops.Entry, 16)
	done := make(chan error, 1)
	go func() {
		done <- ops.FollowHistory(ctx, js, h, func(e ops.Entry) error { got <- e; return nil })
	}()
	publishTraced(t, js, "h2", 1, "") // another key
	second := publishTraced(t, js, "h1", 2, "")
	w := workertest.Start(t, js, credSpec("h1"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		return d.Emit(ctx, "applied", nil)
	}))
	workertest.WaitIdle(t, js, w.ConsumerName())

	var seen []string
	workertest.WaitUntil(t, "the follower shows the second event and both outcomes", func() bool {
		for {
			select {
			case e := <-got:
				seen = append(seen, e.Kind+":"+e.ID)
			default:
				return len(seen) >= 3
			}
		}
	})
	want := []string{"event:" + second, "outcome:credential-h1-1", "outcome:credential-h1-3"}
	if strings.Join(seen, " ") != strings.Join(want, " ") {
		t.Fatalf("followed %v, want %v", seen, want)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("follow ended with %v, want nil on cancel", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("follow did not end when its context was cancelled")
	}
}
