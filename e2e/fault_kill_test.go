package e2e

import (
	"context"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/steward-dev/steward/events"
)

// seed returns the seed of a test's random choices: STEWARD_E2E_SEED when
// set, so a failing run can be repeated, or the clock.
func seed(t testing.TB) uint64 {
	t.Helper()
	s := uint64(time.Now().UnixNano())
	if v := os.Getenv("STEWARD_E2E_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("STEWARD_E2E_SEED=%q: %v", v, err)
		}
		s = n
	}
	t.Logf("seed %d (STEWARD_E2E_SEED=%d repeats this run's random choices)", s, s)
	return s
}

// TestFaultWorkerKilled is fault 1. Invariant: a worker killed with SIGKILL
// at random points while 1,000 events for 50 keys flow, and restarted each
// time, handles every event, ends in the state of a worker that was never
// killed, never applies an event twice and never moves a key backwards.
//
// Two fault workers consume the same events through their own consumers:
// "calm" is never killed and is the reference run; "chaos" is killed at
// random points of its progress (drawn from a seeded RNG, printed above)
// and spends a moment between writing a key's state and logging it, so some
// kills land between the two.
func TestFaultWorkerKilled(t *testing.T) {
	const (
		keys     = 50
		versions = 20
		total    = keys * versions
		kills    = 20
	)
	rng := rand.New(rand.NewPCG(seed(t), 1))
	n := startNATS(t, "n1")
	b := connect(t, n.url())
	b.ensureStreams(t, 1)
	calm := startFaultWorker(t, "calm", n.url(), 1)
	chaos := startFaultWorker(t, "chaos", n.url(), 1, "--pause", "2ms")

	list := rotations(t, "kill", keys, versions)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	pub := publishAll(ctx, b, list)

	// Kill points are positions in chaos's progress (events settled), so
	// they fall throughout the stream however fast this machine is; a
	// random extra delay moves each off the moment it was seen.
	settled := func() (uint64, string) {
		n, err := b.settled(chaos.consumer())
		if err != nil {
			return 0, err.Error()
		}
		return n, strconv.FormatUint(n, 10) + " settled"
	}
	points := randomPoints(rng.IntN, kills, 20, total-20)
	var recoveries durations
	restarts := 0
	for _, at := range points {
		waitFor(t, "chaos settled "+strconv.Itoa(at)+" events", 2*time.Minute, func() (bool, string) {
			n, why := settled()
			return n >= uint64(at), why
		})
		delay := time.Duration(rng.IntN(30)) * time.Millisecond
		<-time.After(delay)
		chaos.kill()
		before, _ := settled()
		t.Logf("killed chaos at %d settled, %d applied (+%v)", before, len(chaos.log(t)), delay)
		restarted := time.Now()
		chaos.start()
		restarts++
		// Recovered: the new process settles what the killed one held or
		// had not pulled yet (held events come back after AckWait). When
		// the killed one had settled everything, being ready is all there
		// is to recover.
		if before >= total {
			chaos.waitReady(t)
		} else {
			waitFor(t, "chaos settles events again after a restart", 2*time.Minute, func() (bool, string) {
				if gone, err := chaos.exited(); gone {
					t.Fatalf("chaos exited: %v\n%s", err, chaos.tail(20))
				}
				n, why := settled()
				return n > before, why
			})
		}
		recoveries = append(recoveries, time.Since(restarted))
	}

	pub.wait(t, 2*time.Minute)
	for _, fw := range []*faultWorker{calm, chaos} {
		waitFor(t, fw.consumer()+" has settled every event", 2*time.Minute, func() (bool, string) {
			return b.consumerIdle(fw.consumer())
		})
	}
	elapsed := time.Since(start)

	stored := b.streamIDs(t, events.StreamEvents)
	lostPub, dupStored := lostAcked(pub.acked, stored)
	chaosV := judge(chaos.log(t), pub.acked, list)
	calmV := judge(calm.log(t), pub.acked, list)
	dead := b.streamIDs(t, events.StreamDLQ)

	if len(pub.acked) != total || lostPub != 0 || dupStored != 0 {
		t.Errorf("published %d of %d events; %d acknowledged ones missing from the stream, %d stored twice", len(pub.acked), total, lostPub, dupStored)
	}
	if len(dead) != 0 {
		t.Errorf("%d events in the DLQ; none should be", len(dead))
	}
	if calmV.applied != total || calmV.lost+calmV.duplicates+calmV.backwards+calmV.superseded+calmV.stale != 0 {
		t.Errorf("the reference worker: %+v; want all %d applied once, in order", calmV, total)
	}
	if chaosV.lost != 0 || chaosV.duplicates != 0 || chaosV.backwards != 0 {
		t.Errorf("the killed worker: %+v; want nothing lost, applied twice or moved backwards", chaosV)
		for _, h := range hivesOf(chaosV.examples) {
			for _, a := range chaos.log(t) {
				if a.Hive == h {
					t.Logf("  %s: %+v", h, a)
				}
			}
		}
	}
	if chaosV.applied+chaosV.superseded != total {
		t.Errorf("the killed worker applied %d and skipped %d as superseded; want %d together", chaosV.applied, chaosV.superseded, total)
	}
	calmState, chaosState := calm.state(t), chaos.state(t)
	if d := checkEndState(calmState, keys, versions); len(d) > 0 {
		t.Errorf("reference end state differs from version %d everywhere: %v", versions, d)
	}
	if d := checkEndState(chaosState, keys, versions); len(d) > 0 {
		t.Errorf("killed worker's end state differs from the reference: %v", d)
	}
	for h, s := range calmState {
		if c := chaosState[h]; c.Version != s.Version || c.ClientID != s.ClientID || c.Seq != s.Seq {
			t.Errorf("hive %s: killed worker holds %+v, reference %+v", h, c, s)
		}
	}

	summary(t, "fault1-worker-killed",
		"events", total, "keys", keys, "kills", len(points), "restarts", restarts,
		"applied", chaosV.applied, "superseded", chaosV.superseded, "recovered_logs", chaosV.recovered,
		"stale_deliveries", chaosV.stale,
		"lost", chaosV.lost, "duplicates_applied", chaosV.duplicates, "backwards", chaosV.backwards,
		"recover_mean", round(recoveries.mean()), "recover_max", round(recoveries.max()),
		"elapsed", round(elapsed), "rate", rate(total, elapsed))
	t.Logf("recovery after each restart: %v", recoveries)
}
