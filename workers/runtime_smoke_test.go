package workers_test

import (
	"context"
	"testing"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

func TestSmoke(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	spec := workers.Spec{Name: "test", Instance: "one", Subjects: []string{"steward.events.credential.rotated.>"}, Types: []string{events.TypeCredentialRotated}}
	var n int
	r := workertest.Start(t, js, spec, workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		n++
		return d.Emit(ctx, "done", map[string]any{"seq": d.Sequence})
	}))
	workertest.PublishData(t, js, events.TypeCredentialRotated, "h1", events.CredentialRotated{Hive: "h1", Version: 1, ClientID: "c", Secret: "-----BEGIN AGE ENCRYPTED FILE-----\nx"})
	workertest.WaitIdle(t, js, r.ConsumerName())
	if n != 1 {
		t.Fatalf("handled %d", n)
	}
	if got := workertest.Outcomes(t, js, "test", "one"); len(got) != 1 {
		t.Fatalf("outcomes %d", len(got))
	}
}
