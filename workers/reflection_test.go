package workers_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/natsauth"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// The attacks of docs/design.md §7, as an identity issued the way users
// issue them would make them: a box's own credentials (join-dev-box) have
// the server write a message it shaped under another instance's keys of
// the checkpoint bucket, by a request whose reply subject is that key.
// NATS never checks a reply subject, and JetStream answers from inside the
// account, so the bucket stores the answer. The victim must apply its next
// event exactly as if nothing had happened, and count and show the
// forgery with the key it was reflected from.

// bus is a closed bus as steward dev runs it, set up by the operator.
type bus struct {
	srv      *workertest.ClosedServer
	opJS     jetstream.JetStream
	opDocs   *events.Store
	attacker *nats.Conn
	attackJS jetstream.JetStream
}

func startBus(t *testing.T) *bus {
	t.Helper()
	srv := workertest.StartClosedServer(t)
	_, opJS := srv.ConnectAs(t, natsauth.Operator())
	ctx := context.Background()
	if err := events.SetupBus(ctx, opJS, events.DefaultBusConfig(1)); err != nil {
		t.Fatal(err)
	}
	signer, verifier := srv.Keys(t, natsauth.Operator())
	docs, err := events.OpenStore(ctx, opJS, events.StoreOptions{Signer: signer, Verifier: verifier})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := docs.RecordUpgrade(ctx); err != nil {
		t.Fatal(err)
	}
	box, _ := natsauth.Worker("join", "dev-box")
	nc, js := srv.ConnectAs(t, box)
	return &bus{srv: srv, opJS: opJS, opDocs: docs, attacker: nc, attackJS: js}
}

// victim runs the test worker as its own identity, with the document keys
// beside its credentials, as `steward worker` does.
func (b *bus) victim(t *testing.T, spec workers.Spec, reg *prometheus.Registry, opts ...workers.Option) *workertest.Running {
	t.Helper()
	id, err := natsauth.Worker(spec.Name, spec.Instance)
	if err != nil {
		t.Fatal(err)
	}
	_, js := b.srv.ConnectAs(t, id)
	opts = append([]workers.Option{b.srv.DocumentKeys(t, id), workers.WithRegisterer(reg), workertest.StatusEvery(50 * time.Millisecond)}, opts...)
	return workertest.Start(t, js, spec, workers.HandlerFunc(func(context.Context, *workers.Delivery) error { return nil }), opts...)
}

const kvPrefix = "$KV." + events.CheckpointBucket + "."

// reflectDirectGet stores body under the attacker's own key, then sends a
// direct get of that key with victimKey's subject as the reply: the
// bucket's stream stores the answer under victimKey.
func (b *bus) reflectDirectGet(t *testing.T, own, victimKey string, body any) {
	t.Helper()
	raw, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := b.attackJS.Publish(ctx, kvPrefix+own, raw); err != nil {
		t.Fatalf("the attacker may write its own key %s: %v", own, err)
	}
	get := "$JS.API.DIRECT.GET.KV_" + events.CheckpointBucket + "." + kvPrefix + own
	if err := b.attacker.PublishRequest(get, kvPrefix+victimKey, nil); err != nil {
		t.Fatal(err)
	}
	b.landed(t, victimKey, raw)
}

// reflectAck publishes on the attacker's own outcome subject with
// victimKey's subject as the reply: the outcome stream's acknowledgement
// is stored under victimKey.
func (b *bus) reflectAck(t *testing.T, victimKey string) {
	t.Helper()
	if err := b.attacker.PublishRequest(events.OutcomeSubject("join", "dev-box"), kvPrefix+victimKey, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	b.landed(t, victimKey, []byte(`"stream":"`+events.StreamOutcomes+`"`))
}

// landed waits until the bucket holds what the attacker shaped under key,
// so a test that passes has been attacked for real.
func (b *bus) landed(t *testing.T, key string, want []byte) {
	t.Helper()
	kv, err := b.opJS.KeyValue(context.Background(), events.CheckpointBucket)
	if err != nil {
		t.Fatal(err)
	}
	workertest.WaitUntil(t, "the reflected message is stored under "+key, func() bool {
		e, err := kv.Get(context.Background(), key)
		return err == nil && strings.Contains(string(e.Value()), strings.Trim(string(want), "{}"))
	})
}

// forgedCount reads steward_forged_documents_total for kind.
func forgedCount(t *testing.T, reg *prometheus.Registry, kind events.DocKind) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "steward_forged_documents_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == string(kind) {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// shownForged waits until steward status, read as the operator, shows a
// forgery of kind under key for instance, and returns it.
func (b *bus) shownForged(t *testing.T, instance string, kind events.DocKind, key string) events.Forgery {
	t.Helper()
	var found events.Forgery
	workertest.WaitUntil(t, "status shows the forged "+string(kind)+" "+key, func() bool {
		st, err := ops.GetStatus(context.Background(), b.opJS, ops.StatusOptions{Instance: instance, Docs: b.opDocs, Limit: -1})
		if err != nil {
			return false
		}
		for _, in := range st.Instances {
			for _, f := range in.Forgeries {
				if f.Kind == kind && f.Key == key {
					found = f
					return true
				}
			}
		}
		return false
	})
	return found
}

func TestABoxCannotMakeAnotherInstanceSkipItsEvents(t *testing.T) {
	b := startBus(t)
	for _, how := range []string{"direct get", "publish acknowledgement"} {
		t.Run(how, func(t *testing.T) {
			hive := "hive-cp"
			if how != "direct get" {
				hive = "hive-ack"
			}
			spec := hostSpec(hive)
			reg := prometheus.NewRegistry()
			r := b.victim(t, spec, reg)
			publishRotation(t, b.opJS, hive, 1)
			workertest.WaitIdle(t, b.opJS, r.ConsumerName())
			if err := r.Stop(); err != nil {
				t.Fatal(err)
			}
			// The attack: the victim's checkpoint says a
			// sequence far beyond anything stored, so every later
			// event would be skipped as a late redelivery.
			key := events.CheckpointKey(testWorker, hive, events.TypeCredentialRotated, hive)
			if how == "direct get" {
				b.reflectDirectGet(t, "cp.join.dev-box.x", key, events.Checkpoint{Applied: 1_000_000_000})
			} else {
				b.reflectAck(t, key)
			}

			reg = prometheus.NewRegistry()
			handled := make(chan uint64, 4)
			id, _ := natsauth.Worker(spec.Name, spec.Instance)
			_, js := b.srv.ConnectAs(t, id)
			r = workertest.Start(t, js, spec, workers.HandlerFunc(func(_ context.Context, d *workers.Delivery) error {
				handled <- versionOf(t, d)
				return nil
			}), b.srv.DocumentKeys(t, id), workers.WithRegisterer(reg), workertest.StatusEvery(50*time.Millisecond), workers.WithLogger(zerolog.New(zerolog.NewTestWriter(t))))
			publishRotation(t, b.opJS, hive, 2)
			select {
			case v := <-handled:
				if v != 2 {
					t.Fatalf("handled version %d, want 2", v)
				}
			case <-time.After(workertest.DefaultTimeout):
				t.Fatal("the next signed event was not applied: the forged checkpoint was believed")
			}
			workertest.WaitIdle(t, b.opJS, r.ConsumerName())
			if n := forgedCount(t, reg, events.KindCheckpoint); n < 1 {
				t.Fatalf("steward_forged_documents_total{kind=checkpoint} = %v, want the forgery counted", n)
			}
			f := b.shownForged(t, hive, events.KindCheckpoint, key)
			want := "cp.join.dev-box.x"
			if how != "direct get" {
				want = "publish acknowledgement of stream " + events.StreamOutcomes
			}
			if !strings.Contains(f.ReflectedFrom, want) {
				t.Fatalf("status shows the forgery reflected from %q, want it to name %q", f.ReflectedFrom, want)
			}
		})
	}
}

func TestABoxCannotPauseOrRewindAStreamReader(t *testing.T) {
	b := startBus(t)
	hive := "hive-sr"
	spec := hostSpec(hive)
	handled := make(chan uint64, 8)
	id, _ := natsauth.Worker(spec.Name, spec.Instance)
	start := func() (*workertest.Running, *prometheus.Registry) {
		reg := prometheus.NewRegistry()
		_, js := b.srv.ConnectAs(t, id)
		return workertest.Start(t, js, spec, workers.HandlerFunc(func(_ context.Context, d *workers.Delivery) error {
			handled <- versionOf(t, d)
			return nil
		}), b.srv.DocumentKeys(t, id), workers.WithRegisterer(reg), workers.WithReadMode(workers.ReadStream), workertest.StatusEvery(50*time.Millisecond)), reg
	}
	next := func(want uint64) {
		t.Helper()
		select {
		case v := <-handled:
			if v != want {
				t.Fatalf("handled version %d, want %d", v, want)
			}
		case <-time.After(workertest.DefaultTimeout):
			t.Fatalf("version %d was not applied", want)
		}
	}
	r, reg := start()
	publishRotation(t, b.opJS, hive, 1)
	next(1)

	// A pause until 2099, reflected under the instance's pause key: only
	// an operator's signature makes a pause, so it is ignored.
	pause := events.PauseKey(testWorker, hive)
	b.reflectDirectGet(t, "cp.join.dev-box.p", pause, events.Pause{Until: time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)})
	publishRotation(t, b.opJS, hive, 2)
	next(2)
	if n := forgedCount(t, reg, events.KindPause); n < 1 {
		t.Fatalf("steward_forged_documents_total{kind=pause} = %v, want the forged pause counted", n)
	}
	if f := b.shownForged(t, hive, events.KindPause, pause); !strings.Contains(f.ReflectedFrom, "cp.join.dev-box.p") {
		t.Fatalf("the forged pause is shown reflected from %q", f.ReflectedFrom)
	}
	workertest.WaitIdle(t, b.opJS, r.ConsumerName())
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}

	// A cursor far ahead of the stream: believed, the reader would read
	// nothing more. It is not; the next event applies.
	cursor := events.CursorKey(testWorker, hive)
	b.reflectDirectGet(t, "cp.join.dev-box.c", cursor, events.Cursor{Subjects: map[string]uint64{spec.Subjects[0]: 1_000_000_000}})
	publishRotation(t, b.opJS, hive, 3)
	_, reg = start()
	next(3)
	if n := forgedCount(t, reg, events.KindCursor); n < 1 {
		t.Fatalf("steward_forged_documents_total{kind=cursor} = %v, want the forged cursor counted", n)
	}
	select {
	case v := <-handled:
		// Versions 1 and 2 are read again after the cursor is not
		// believed, and their checkpoints skip them: no handler runs.
		t.Fatalf("version %d was handled again", v)
	default:
	}
}

func TestABoxCannotForgeAnInstancesStateOrStatus(t *testing.T) {
	b := startBus(t)
	hive := "hive-st"
	spec := hostSpec(hive)
	r := b.victim(t, spec, prometheus.NewRegistry())
	ctx := context.Background()
	if _, err := r.State().Put(ctx, "installed", map[string]string{"version": "1.0.0"}, 0); err != nil {
		t.Fatal(err)
	}
	// converge's installed version, replaced by the attacker's.
	b.reflectDirectGet(t, "st.join.dev-box.installed", events.StateKey(testWorker, hive, "installed"), map[string]string{"version": "1.1.0"})
	var doc map[string]string
	rev, err := r.State().Get(ctx, "installed", &doc)
	if !errors.Is(err, workers.ErrUntrusted) || rev == 0 || doc != nil {
		t.Fatalf("the forged state document read as %v at revision %d (%v); want it untrusted, with its revision for the overwrite", doc, rev, err)
	}
	if _, err := r.State().Put(ctx, "installed", map[string]string{"version": "1.0.0"}, rev); err != nil {
		t.Fatalf("the instance cannot write over the forgery: %v", err)
	}
	if _, err := r.State().Get(ctx, "installed", &doc); err != nil || doc["version"] != "1.0.0" {
		t.Fatalf("after the overwrite: %v (%v)", doc, err)
	}

	// A status document saying the instance retries forever: shown as
	// forged, not as fact.
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	status := events.StatusKey(testWorker, hive)
	b.reflectDirectGet(t, "rt.join.dev-box", status, events.Status{Worker: testWorker, Instance: hive,
		Retrying: []events.RetryingKey{{Key: hive, EventID: "forged", Attempt: 99, LastError: "forged"}}})
	st, err := ops.GetStatus(ctx, b.opJS, ops.StatusOptions{Instance: hive, Docs: b.opDocs})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Instances) != 1 || st.Instances[0].StatusForged == "" || len(st.Instances[0].Retrying) != 0 {
		t.Fatalf("status shows %+v; want the status document marked forged and nothing it says listed", st.Instances)
	}
}

// TestAGenuineOlderDocumentPutBackIsNotBelieved: the instance's own
// earlier document, genuinely signed, put back under its key (only the
// operator or the instance itself can read older revisions) is older than
// what the running instance has seen, so it is not believed: state never
// moves backwards because a document was replaced. After a restart the
// instance has no high-water mark to compare with (docs/design.md §7).
func TestAGenuineOlderDocumentPutBackIsNotBelieved(t *testing.T) {
	b := startBus(t)
	hive := "hive-rb"
	r := b.victim(t, hostSpec(hive), prometheus.NewRegistry())
	ctx := context.Background()
	rev, err := r.State().Put(ctx, "installed", map[string]string{"version": "1.0.0"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := b.opJS.KeyValue(ctx, events.CheckpointBucket)
	if err != nil {
		t.Fatal(err)
	}
	key := events.StateKey(testWorker, hive, "installed")
	old, err := kv.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.State().Put(ctx, "installed", map[string]string{"version": "1.1.0"}, rev); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, key, old.Value()); err != nil {
		t.Fatal(err)
	}
	var doc map[string]string
	_, err = r.State().Get(ctx, "installed", &doc)
	if !errors.Is(err, workers.ErrUntrusted) || !strings.Contains(err.Error(), "older document") || doc != nil {
		t.Fatalf("the put-back 1.0.0 read as %v (%v); want it refused as an older document", doc, err)
	}
}
