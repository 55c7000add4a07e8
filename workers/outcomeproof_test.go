package workers_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/streamread"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/replay"
	"github.com/steward-dev/steward/workers/workertest"
)

// verifyStored checks every outcome stored on the instance's subject with
// domain and returns how many verified and the first failure.
func verifyStored(t *testing.T, js jetstream.JetStream, instance, domain string) (ok int, failure error) {
	t.Helper()
	subject := events.OutcomeSubject(testWorker, instance)
	err := streamread.Each(context.Background(), js, streamread.Range{Stream: events.StreamOutcomes, Subjects: []string{subject}}, func(m jetstream.Msg) error {
		e, err := events.Decode(m.Headers(), m.Data())
		if err != nil {
			return err
		}
		if err := events.VerifyOutcome(workertest.Verifier(), domain, m.Subject(), m.Headers(), m.Data(), e); err != nil {
			failure = errors.Join(failure, err)
			return nil
		}
		ok++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ok, failure
}

// TestOutcomesOfTheConsumerAndOfAReplayAreSigned proves the live consumer's
// outcomes and the ones a Replayer publishes carry the instance's proof for
// its domain, so readers believe them, and that the proof binds the domain:
// read as another site's, none verifies.
func TestOutcomesOfTheConsumerAndOfAReplayAreSigned(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	h := workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		return d.Emit(ctx, "applied", map[string]any{"version": versionOf(t, d)})
	})
	sp := spec("signed")
	r := workertest.Start(t, js, sp, h, workers.WithDomain("site-a"))
	publishRotation(t, js, "hive-s", 1)
	workertest.WaitIdle(t, js, r.ConsumerName())

	rp, err := replay.New(context.Background(), js, sp, h, workertest.DocumentKeys(sp.Name, sp.Instance), workers.WithDomain("site-a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := rp.Replay(context.Background(), replay.From{}, false, nil, func(replay.Result) {}); err != nil {
		t.Fatal(err)
	}
	outs := workertest.Outcomes(t, js, testWorker, sp.Instance)
	if len(outs) != 2 || outs[1].Extensions()[events.ReplayExtension] == nil {
		t.Fatalf("outcomes %v: want the live one and the replayed one", outs)
	}
	if ok, err := verifyStored(t, js, sp.Instance, "site-a"); ok != 2 || err != nil {
		t.Fatalf("%d of 2 outcomes verified: %v", ok, err)
	}
	if ok, err := verifyStored(t, js, sp.Instance, "site-b"); ok != 0 || err == nil || !strings.Contains(err.Error(), "does not verify") {
		t.Fatalf("read as another domain, %d outcomes verified (%v)", ok, err)
	}
}

// TestDeadLettersAreSigned proves the runtime's dead letter verifies as
// its instance's.
func TestDeadLettersAreSigned(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	sp := spec("signed-dlq")
	r := workertest.Start(t, js, sp, workers.HandlerFunc(func(context.Context, *workers.Delivery) error {
		return workers.Permanent(errors.New("the hive's folder is gone"))
	}))
	publishRotation(t, js, "hive-d", 1)
	workertest.WaitIdle(t, js, r.ConsumerName())
	var letters []events.DeadLetter
	workertest.WaitUntil(t, "the dead letter is stored", func() bool {
		letters = workertest.DeadLetters(t, js, testWorker, sp.Instance)
		return len(letters) == 1
	})
	if err := letters[0].VerifyProof(workertest.Verifier(), ""); err != nil {
		t.Fatalf("the runtime's dead letter does not verify: %v", err)
	}
}
