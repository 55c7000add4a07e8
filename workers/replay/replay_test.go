package replay_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/replay"
	"github.com/steward-dev/steward/workers/workertest"
)

// TestReplayGivesTheRuntimesVerdicts replays a stored history through a
// handler on an embedded server, once as a dry run and once for real: an
// applied event, one the handler refuses, one that fails, and one stored
// on the worker's subject that is not its type, which never reaches the
// handler.
func TestReplayGivesTheRuntimesVerdicts(t *testing.T) {
	js := workertest.StartServer(t).JetStream(t)
	spec := workers.Spec{
		Name: "demo", Instance: "h1",
		Subjects: []string{"steward.events.credential.rotated.h1"},
		Types:    []string{events.TypeCredentialRotated},
	}
	for v, client := range []string{"ok", "refuse", "fail"} {
		workertest.PublishData(t, js, events.TypeCredentialRotated, "h1", events.CredentialRotated{
			Hive: "h1", Version: uint64(v + 1), ClientID: client, Secret: "-----BEGIN AGE ENCRYPTED FILE-----\nx\n-----END AGE ENCRYPTED FILE-----",
		})
	}
	// A release on the hive's subject: stored past the publisher's checks,
	// as a hostile publisher could.
	wrong, err := events.New(events.TypeReleasePublished, "1.0.0", events.ReleasePublished{Version: "1.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := events.Encode("steward.events.credential.rotated.h1", wrong)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}

	ran := 0
	h := workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		ran++
		var r events.CredentialRotated
		if err := d.DataAs(&r); err != nil {
			return err
		}
		switch r.ClientID {
		case "refuse":
			return workers.Refused(errors.New("not this one"))
		case "fail":
			return errors.New("the disk is full")
		}
		return d.Emit(ctx, "applied", map[string]uint64{"version": r.Version})
	})
	rp, err := replay.New(context.Background(), js, spec, h, workertest.DocumentKeys(spec.Name, spec.Instance))
	if err != nil {
		t.Fatal(err)
	}
	if rp.ConsumerName() != "demo-h1" {
		t.Fatalf("consumer name %q", rp.ConsumerName())
	}
	verdicts := func(dry bool) (out []string, total uint64) {
		err := rp.Replay(context.Background(), replay.From{}, dry, func(n uint64) { total = n }, func(r replay.Result) { out = append(out, r.Verdict) })
		if err != nil {
			t.Fatal(err)
		}
		return out, total
	}
	dry, total := verdicts(true)
	if want := []string{replay.WouldHandle, replay.WouldHandle, replay.WouldHandle, replay.Invalid}; !slices.Equal(dry, want) || total != 4 || ran != 0 {
		t.Fatalf("dry run: %v of %d, handler ran %d times; want %v of 4 and none", dry, total, ran, want)
	}
	real, _ := verdicts(false)
	if want := []string{replay.Applied, replay.Refused, replay.Failed, replay.Invalid}; !slices.Equal(real, want) || ran != 3 {
		t.Fatalf("replay: %v, handler ran %d times; want %v and 3", real, ran, want)
	}
	// Its outcome is marked as a replay's.
	outs := workertest.Outcomes(t, js, spec.Name, spec.Instance)
	if len(outs) != 1 || (outs[0].Extensions()[events.ReplayExtension] != true && outs[0].Extensions()[events.ReplayExtension] != "true") {
		t.Fatalf("outcomes %v, want one marked %s", outs, events.ReplayExtension)
	}
}
