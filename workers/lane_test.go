package workers

import (
	"testing"
	"time"
)

// The per-key queue is plain data: these tests drive it with made-up
// sequences and a fake clock, with no server.

func seqs(l *lane) []uint64 {
	var out []uint64
	for _, h := range l.queue {
		out = append(out, h.seq)
	}
	return out
}

func TestLaneKeepsStreamOrderWhateverTheArrivalOrder(t *testing.T) {
	l := newLane()
	for _, s := range []uint64{7, 3, 9, 5} {
		l.insert(&held{seq: s})
	}
	if got := seqs(l); len(got) != 4 || got[0] != 3 || got[1] != 5 || got[2] != 7 || got[3] != 9 {
		t.Fatalf("queue %v, want [3 5 7 9]", got)
	}
	if l.indexOf(7) != 2 || l.indexOf(4) != -1 {
		t.Fatalf("indexOf(7) = %d, indexOf(4) = %d", l.indexOf(7), l.indexOf(4))
	}
	if h := l.pop(); h.seq != 3 || len(l.queue) != 3 {
		t.Fatalf("pop = %d, left %v", h.seq, seqs(l))
	}
}

func TestLaneWaitsForAnEarlierEventUntilItArrivesOrTheWaitRunsOut(t *testing.T) {
	clock := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	l := newLane()
	l.insert(&held{seq: 10})
	l.waitFor, l.waitUntil = 8, clock.Add(30*time.Second)
	if !l.blocked() {
		t.Fatal("a lane waiting for 8 runs 10")
	}
	if l.expire(clock.Add(10 * time.Second)) {
		t.Fatal("the wait ended before its deadline")
	}
	l.arrived(8)
	if l.blocked() {
		t.Fatal("the awaited event arrived and the lane is still blocked")
	}

	l.waitFor = 9
	if !l.expire(clock.Add(31*time.Second)) || l.blocked() {
		t.Fatal("the wait did not end at its deadline")
	}
	l.waitFor = 9
	l.arrived(12) // a later event does not end the wait
	if !l.blocked() {
		t.Fatal("a later arrival ended the wait for an earlier event")
	}
}

func ranked(seq, rank uint64) *held {
	return &held{seq: seq, rank: rank, ranked: true, rankDone: true}
}

func TestLaneSupersedesTheHeadWithTheNewestVerifiedEvent(t *testing.T) {
	l := newLane()
	l.insert(ranked(1, 5))
	l.insert(ranked(2, 7))
	l.insert(&held{seq: 3, rankDone: true}) // failed verification: unranked
	l.insert(ranked(4, 9))
	l.insert(ranked(5, 6))
	if w := l.superseded(); w == nil || w.seq != 4 {
		t.Fatalf("winner %v, want sequence 4 (rank 9)", w)
	}
}

func TestLaneTiesGoToTheLaterEvent(t *testing.T) {
	l := newLane()
	l.insert(ranked(1, 5))
	l.insert(ranked(2, 5))
	if w := l.superseded(); w == nil || w.seq != 2 {
		t.Fatalf("winner %v, want the later event of the same rank", w)
	}
}

func TestLaneUnverifiedEventsSupersedeNothingAndAreNeverSuperseded(t *testing.T) {
	l := newLane()
	l.insert(ranked(1, 5))
	l.insert(&held{seq: 2, rankDone: true}) // a forged huge generation: Rank refused it
	if w := l.superseded(); w != nil {
		t.Fatalf("an unverified event superseded the head: %v", w)
	}
	u := newLane()
	u.insert(&held{seq: 1, rankDone: true})
	u.insert(ranked(2, 9))
	if w := u.superseded(); w != nil {
		t.Fatalf("an unverified head was superseded by %v; it must reach the handler to be refused", w)
	}
}

func TestLaneOlderRankBehindTheHeadDoesNotSupersedeIt(t *testing.T) {
	l := newLane()
	l.insert(ranked(1, 9))
	l.insert(ranked(2, 3))
	if w := l.superseded(); w != nil {
		t.Fatalf("an older version superseded a newer head: %v", w)
	}
	if got := len(l.unranked()); got != 0 {
		t.Fatalf("%d unranked, want 0", got)
	}
	l.insert(&held{seq: 3})
	if got := l.unranked(); len(got) != 1 || got[0].seq != 3 {
		t.Fatalf("unranked %v, want [3]", got)
	}
}

// TestLaneIsReadyOnlyWhenItsNextStepNeedsNoWrite is what decides whether a
// run of settled events goes on or is recorded first (batch.go).
func TestLaneIsReadyOnlyWhenItsNextStepNeedsNoWrite(t *testing.T) {
	clock := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	l := newLane()
	if l.ready(clock, false) {
		t.Fatal("an empty lane is ready")
	}
	l.insert(&held{seq: 4})
	if !l.ready(clock, false) {
		t.Fatal("a queued event with nothing before it is not ready")
	}
	l.queue[0].retryAt = clock.Add(time.Second)
	if l.ready(clock, false) || !l.ready(clock.Add(2*time.Second), false) {
		t.Fatal("a head waiting for its retry is ready before its time, or not after it")
	}
	l.queue[0].retryAt = time.Time{}
	l.waitFor, l.waitUntil = 3, clock.Add(time.Minute)
	if l.ready(clock, false) || l.ready(clock, true) {
		t.Fatal("a head behind an earlier event held elsewhere is ready")
	}
	l.waitFor = 0

	// Latest-wins: ranking, superseding and the look at the stream for a
	// newer event need no checkpoint write of their own, so the run goes
	// on through them; a head that only waits for its retry does not.
	if !l.ready(clock, true) {
		t.Fatal("a lane whose next step is ranking is not ready")
	}
	l.queue[0].rankDone, l.queue[0].ranked, l.queue[0].rank = true, true, 1
	l.queue[0].retryAt = clock.Add(time.Second)
	if l.ready(clock, true) {
		t.Fatal("a ranked head waiting for its retry is ready")
	}
	l.insert(&held{seq: 5, rankDone: true, ranked: true, rank: 2})
	if !l.ready(clock, true) {
		t.Fatal("a head a queued newer event supersedes at once is not ready")
	}
	l.pop()
	if !l.ready(clock, true) {
		t.Fatal("a ranked head with nothing before it is not ready")
	}
	l.queue[0].parked = true
	if l.ready(clock, true) {
		t.Fatal("a parked head is ready")
	}
}

// TestALaneSupersedesAHeadThatFailedToSettleOnlyAfterItsBackoff keeps a
// latest-wins lane from superseding, at once and over and over, a head
// whose outcome or checkpoint could not be written (the server is away).
func TestALaneSupersedesAHeadThatFailedToSettleOnlyAfterItsBackoff(t *testing.T) {
	clock := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	l := newLane()
	l.insert(&held{seq: 4, rankDone: true, ranked: true, rank: 1})
	l.insert(&held{seq: 5, rankDone: true, ranked: true, rank: 2})
	if w := l.supersedesNow(clock); w == nil || w.seq != 5 {
		t.Fatalf("the head is superseded by %v, want the event at 5", w)
	}
	l.queue[0].unsettled, l.queue[0].retryAt = true, clock.Add(time.Second)
	if w := l.supersedesNow(clock); w != nil || l.ready(clock, true) {
		t.Fatalf("a head that failed to settle is superseded (by %v) or ready before its retry time", w)
	}
	if w := l.supersedesNow(clock.Add(2 * time.Second)); w == nil || !l.ready(clock.Add(2*time.Second), true) {
		t.Fatal("a head that failed to settle is not superseded once its retry time has come")
	}
	l.queue[0].unsettled = false
	if w := l.supersedesNow(clock); w == nil {
		t.Fatal("a head retrying its handler is not superseded at once by a newer event")
	}
}
