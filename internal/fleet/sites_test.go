package fleet

import (
	"context"
	"testing"
	"time"
)

// TestSitesBenchSettlesEveryEventThroughACut runs bench fleet --sites at
// a tiny size, so the mode cannot rot: a hub and one leaf node, each a
// process of this binary, 20 instances at the site and 20 at the hub; the
// burst settles at both, and every one of the events queued for the site
// during its cut is settled there after the heal, applied or superseded,
// none lost.
func TestSitesBenchSettlesEveryEventThroughACut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const instances, queued = 20, 200
	res, err := RunSites(ctx, Options{
		Instances: instances, Sites: 1, Queued: queued, Timeout: time.Minute,
		ServerCommand: selfServer(), Progress: t.Logf,
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, res)
	}
	t.Logf("\n%s", res)
	if res.Hub.Events != instances || res.Leaf.Events != instances || res.BurstEvents != 2*instances {
		t.Errorf("burst: %d settled at the hub and %d at the site of %d; want %d each", res.Hub.Events, res.Leaf.Events, res.BurstEvents, instances)
	}
	if res.Hub.P50 <= 0 || res.Hub.P99 < res.Hub.P50 || res.Leaf.P50 <= 0 || res.Leaf.P99 < res.Leaf.P50 {
		t.Errorf("burst latencies hub %+v, leaf %+v: want p50 > 0 and p99 >= p50", res.Hub, res.Leaf)
	}
	if res.CutSite != "site-1" || res.PendingInCut != queued {
		t.Errorf("the cut of %q: the hub held %d pending, want site-1 and %d", res.CutSite, res.PendingInCut, queued)
	}
	checkSettledOnce(t, res, queued)
	if w := res.SiteWrites; w.Events != queued || w.Outcomes != queued || w.Bucket == 0 {
		t.Errorf("the site's writes during the catch-up %+v: want the %d events stored, an outcome each, and checkpoints", w, queued)
	}
	// Stored is when a sample of the site's stream first saw every event
	// (every 250 ms), CaughtUp when the last was settled, to the event: a
	// site can settle the last before the sample that sees it stored.
	if res.Relinked <= 0 || res.Stored < res.Relinked || res.CaughtUp < res.Relinked || res.Rate() <= 0 || len(res.Samples) == 0 {
		t.Errorf("catch-up: relinked %v, stored %v, caught up %v, %.0f events/s, %d samples: want each after the one before",
			res.Relinked, res.Stored, res.CaughtUp, res.Rate(), len(res.Samples))
	}
}

// TestSitesBenchSurvivesTheLeafKilledInTheCatchUp SIGKILLs the cut site's
// leaf node as soon as the catch-up has stored an event there: started
// again, the leaf resumes from the hub's ack floor, so whatever it had
// acknowledged must have been written (an async events stream once lost 6
// of 2,000 here). Nothing may be lost, applied twice or backwards, and
// every event keeps one outcome.
func TestSitesBenchSurvivesTheLeafKilledInTheCatchUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const queued = 2000
	res, err := RunSites(ctx, Options{
		Instances: 20, Sites: 1, Queued: queued, KillLeafAt: 1, Timeout: 2 * time.Minute,
		ServerCommand: selfServer(), Progress: t.Logf,
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, res)
	}
	t.Logf("\n%s", res)
	if res.LeafKilled <= 0 {
		t.Fatal("the catch-up ended before the leaf node could be killed in it")
	}
	checkSettledOnce(t, res, queued)
}

// checkSettledOnce checks every queued event of res was settled, applied
// or superseded, none twice, none backwards, each with one outcome.
func checkSettledOnce(t *testing.T, res SitesResult, queued int) {
	t.Helper()
	if settled := res.Results["applied"] + res.Results["superseded"]; settled != queued || res.Lost != 0 {
		t.Errorf("queued events settled %v, lost %d: want applied + superseded = %d, none lost", res.Results, res.Lost, queued)
	}
	if res.AppliedTwice != 0 || res.Backwards != 0 {
		t.Errorf("applied twice %d, backwards %d: want neither", res.AppliedTwice, res.Backwards)
	}
	if res.ExtraOutcomes != 0 || res.SiteWrites.Outcomes != uint64(queued) {
		t.Errorf("the site stored %d outcomes for %d events, %d of them beyond one an event (%s)", res.SiteWrites.Outcomes, queued, res.ExtraOutcomes, res.ExtraOutcomeExample)
	}
}
