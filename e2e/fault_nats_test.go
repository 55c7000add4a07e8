package e2e

import (
	"context"
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/steward-dev/steward/events"
)

// TestFaultNATSRestart is fault 2. Invariant: with sync_interval: always,
// restarting the NATS server mid-stream, once with SIGTERM and once with
// SIGKILL, loses nothing it acknowledged; the worker, never restarted,
// reconnects and applies every event.
func TestFaultNATSRestart(t *testing.T) {
	const (
		keys     = 30
		versions = 20
		total    = keys * versions
	)
	n := startNATS(t, "n1")
	b := connect(t, n.url())
	b.ensureStreams(t, 1)
	fw := startFaultWorker(t, "steady", n.url(), 1)

	list := rotations(t, "restart", keys, versions)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	pub := publishAll(ctx, b, list)

	var pubRecover, workRecover, outage durations
	var acks [2]int
	for i, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		at := (i + 1) * total / 3
		waitFor(t, fmt.Sprintf("%d events acknowledged", at), 2*time.Minute, func() (bool, string) {
			n := pub.count()
			return n >= at, strconv.Itoa(n) + " acknowledged"
		})
		settled, _ := b.settled(fw.consumer())
		down := time.Now()
		n.p.signal(sig)
		if _, ok := n.p.wait(30 * time.Second); !ok {
			t.Fatalf("nats still running 30s after %v", sig)
		}
		acks[i] = pub.count()
		t.Logf("nats stopped with %v at %d acknowledged, %d settled", sig, acks[i], settled)
		restarted := time.Now()
		n.p.start()
		waitFor(t, "a publish is acknowledged after the restart", time.Minute, func() (bool, string) {
			_, ok := pub.ackedAfter(restarted)
			return ok || pub.count() == total, strconv.Itoa(pub.count()) + " acknowledged"
		})
		if d, ok := pub.ackedAfter(restarted); ok {
			pubRecover = append(pubRecover, d)
			outage = append(outage, restarted.Add(d).Sub(down))
		}
		waitFor(t, "the worker settles events after the restart", time.Minute, func() (bool, string) {
			n, err := b.settled(fw.consumer())
			if err != nil {
				return false, err.Error()
			}
			return n > settled, strconv.FormatUint(n, 10) + " settled"
		})
		workRecover = append(workRecover, time.Since(restarted))
	}

	pub.wait(t, 2*time.Minute)
	waitFor(t, fw.consumer()+" has settled every event", 2*time.Minute, func() (bool, string) {
		return b.consumerIdle(fw.consumer())
	})
	elapsed := time.Since(start)
	v := checkStreamRun(t, b, fw, pub, list, keys, versions)
	if gone, err := fw.exited(); gone || fw.starts != 1 {
		t.Errorf("the worker exited (%v) or was restarted (%d starts); it should have ridden out both restarts", err, fw.starts)
	}

	summary(t, "fault2-nats-restart",
		"events", total, "server_restarts", 2, "signals", "SIGTERM,SIGKILL", "worker_restarts", fw.starts-1,
		"publish_retries", pub.failures, "deduplicated_acks", pub.dups, "applied", v.applied, "superseded", v.superseded,
		"lost", v.lost, "duplicates_applied", v.duplicates, "backwards", v.backwards,
		"outage_max", round(outage.max()),
		"publish_recover_max", round(pubRecover.max()), "worker_recover_max", round(workRecover.max()),
		"acked_before_kill", acks[1],
		"elapsed", round(elapsed))
	t.Logf("outage (signal to first ack) %v; after the restart, first ack in %v, worker settling again in %v", outage, pubRecover, workRecover)
}

// checkStreamRun checks a fault test's run on the bus: every event was
// acknowledged to the publisher and is in the stream once, nothing is in
// the DLQ, and the worker applied every event (or skipped it for a newer
// one of its key), none twice, none backwards, ending with every key at
// its last version.
func checkStreamRun(t testing.TB, b *bus, fw *faultWorker, pub *publisherRun, list []event.Event, keys, versions int) verdict {
	t.Helper()
	stored := b.streamIDs(t, events.StreamEvents)
	lost, dupStored := lostAcked(pub.acked, stored)
	if len(pub.acked) != len(list) || lost != 0 || dupStored != 0 {
		t.Errorf("%d of %d events acknowledged; %d acknowledged ones missing from the stream, %d stored twice", len(pub.acked), len(list), lost, dupStored)
	}
	if dead := b.streamIDs(t, events.StreamDLQ); len(dead) != 0 {
		t.Errorf("%d events in the DLQ; none should be", len(dead))
	}
	v := judge(fw.log(t), pub.acked, list)
	if v.lost != 0 || v.duplicates != 0 || v.backwards != 0 || v.applied+v.superseded != len(list) {
		t.Errorf("the worker: %+v; want all %d applied or superseded, none lost, twice or backwards", v, len(list))
	}
	if d := checkEndState(fw.state(t), keys, uint64(versions)); len(d) > 0 {
		t.Errorf("end state differs from version %d everywhere: %v", versions, d)
	}
	return v
}
