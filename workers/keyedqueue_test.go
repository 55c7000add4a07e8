package workers

import (
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/cloudevents/sdk-go/v2/event"
)

// The keyed queue decides and the lane's runner acts: these tests play the
// runner's part by hand, with a fake clock, made-up events and no server.

type queueRig struct {
	q        *keyedQueue
	clock    time.Time
	stopping atomic.Bool
	tasks    sync.WaitGroup
}

func newQueueRig(latestWins bool) *queueRig {
	r := &queueRig{clock: time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)}
	r.q = newKeyedQueue(latestWins, func() time.Time { return r.clock },
		func() backoff.BackOff { return backoff.NewConstantBackOff(10 * time.Second) }, &r.stopping, &r.tasks)
	return r
}

// event makes the held message of an event of key at seq.
func (r *queueRig) event(key string, seq uint64) *held {
	e := event.New()
	e.SetID("ev-" + strconv.FormatUint(seq, 10))
	return &held{event: e, key: key, lane: "k/" + key, seq: seq, delivered: 1, received: r.clock}
}

func (r *queueRig) mustAdd(t *testing.T, h *held, wantClaim bool) *lane {
	t.Helper()
	added, l := r.q.add(h)
	if !added || (l != nil) != wantClaim {
		t.Fatalf("add %d: added %v, claimed %v; want added, claimed %v", h.seq, added, l != nil, wantClaim)
	}
	return l
}

func (r *queueRig) mustNext(t *testing.T, l *lane, want stepKind) step {
	t.Helper()
	s := r.q.next(l, &batch{lane: l})
	if s.kind != want {
		t.Fatalf("next of %s = %d, want %d", l.name, s.kind, want)
	}
	return s
}

func TestQueueClaimsALaneOnceAndRunsItsEventsInStreamOrder(t *testing.T) {
	r := newQueueRig(false)
	l := r.mustAdd(t, r.event("a", 7), true)
	r.mustAdd(t, r.event("a", 3), false)
	if other := r.mustAdd(t, r.event("b", 5), true); other == l {
		t.Fatal("two keys share a lane")
	}
	for _, want := range []uint64{3, 7} {
		if s := r.mustNext(t, l, stepRun); s.h.seq != want {
			t.Fatalf("ran %d, want %d", s.h.seq, want)
		}
	}
	r.mustNext(t, l, stepDone)
	if _, ok := r.q.lanes["k/a"]; ok {
		t.Fatal("an emptied lane is still kept")
	}
	// An event of the key after its lane ended claims a new one.
	r.mustAdd(t, r.event("a", 9), true)
}

func TestQueueRedeliveryTakesTheQueuedOnesPlaceAndKeepsWhatWasLearnt(t *testing.T) {
	r := newQueueRig(false)
	l := r.mustAdd(t, r.event("a", 1), true)
	r.mustAdd(t, r.event("a", 2), false)
	first := r.mustNext(t, l, stepRun).h
	r.q.retry(l, first, errors.New("dependency down"))

	again := r.event("a", 1)
	again.delivered = 2
	if added, claimed := r.q.add(again); added || claimed != nil {
		t.Fatalf("a redelivery of a queued event: added %v, claimed %v", added, claimed != nil)
	}
	if l.queue[0] != again || again.attempts != 1 || again.lastError != "dependency down" || again.backoff == nil {
		t.Fatalf("the redelivery did not take the queued one's place with its attempts: %+v", again)
	}
	r.mustNext(t, l, stepWait)
	r.clock = r.clock.Add(10 * time.Second)
	h := r.mustNext(t, l, stepRun).h
	if h != again {
		t.Fatal("the runner got the stale delivery")
	}
	// A redelivery of the event its handler runs is left to the runner.
	late := r.event("a", 1)
	late.delivered = 3
	if added, _ := r.q.add(late); added || r.q.held[1] != again {
		t.Fatal("a redelivery replaced a running event")
	}
}

func TestQueueRetryWaitsItsBackoffWithoutBeingOvertaken(t *testing.T) {
	r := newQueueRig(false)
	l := r.mustAdd(t, r.event("a", 1), true)
	r.mustAdd(t, r.event("a", 2), false)
	h := r.mustNext(t, l, stepRun).h
	r.q.retry(l, h, errors.New("token AGE-SECRET-KEY-1QQQQ"))
	if h.attempts != 1 || !h.firstFailure.Equal(r.clock) || strings.Contains(h.lastError, "AGE-SECRET-KEY-1") {
		t.Fatalf("retry recorded attempts %d, first failure %v, error %q", h.attempts, h.firstFailure, h.lastError)
	}
	if s := r.mustNext(t, l, stepWait); s.wait != 10*time.Second {
		t.Fatalf("waits %v, want the backoff's 10s", s.wait)
	}
	r.clock = r.clock.Add(4 * time.Second)
	if s := r.mustNext(t, l, stepWait); s.wait != 6*time.Second {
		t.Fatalf("waits %v, want the 6s left", s.wait)
	}
	r.clock = r.clock.Add(6 * time.Second)
	if s := r.mustNext(t, l, stepRun); s.h != h {
		t.Fatalf("ran %d before the retrying head", s.h.seq)
	}
	retrying, _, _ := r.q.status()
	if len(retrying) != 1 || retrying[0].Sequence != 1 || retrying[0].Attempt != 1 {
		t.Fatalf("status retrying %+v", retrying)
	}
}

func TestQueueRecordsARunBeforeAnythingTheHeadCannotDoAtOnce(t *testing.T) {
	r := newQueueRig(false)
	l := r.mustAdd(t, r.event("a", 1), true)
	r.mustAdd(t, r.event("a", 2), false)
	h := r.mustNext(t, l, stepRun).h
	b := &batch{lane: l}
	b.starting(r.clock)
	b.add(h, resultApplied, checkpoint{}, 0)
	if s := r.q.next(l, b); s.kind != stepRun {
		t.Fatalf("a ready head after a run: %d, want it run in the same run", s.kind)
	}
	r.mustAdd(t, r.event("a", 3), false)
	r.q.retry(l, r.q.lanes["k/a"].queue[0], nil)
	if s := r.q.next(l, b); s.kind != stepFlush {
		t.Fatalf("a retrying head after a run: %d, want the run recorded first", s.kind)
	}
	b.events = nil
	r.clock = r.clock.Add(maxBatchAge)
	b.starting(r.clock)
	b.add(h, resultApplied, checkpoint{}, 0)
	r.clock = r.clock.Add(maxBatchAge)
	if s := r.q.next(l, b); s.kind != stepFlush {
		t.Fatalf("a run past its age: %d, want it recorded", s.kind)
	}
}

func TestQueueWaitsBehindAnEarlierEventUntilItComesOrTheWaitRunsOut(t *testing.T) {
	r := newQueueRig(false)
	l := r.mustAdd(t, r.event("a", 10), true)
	h := r.mustNext(t, l, stepRun).h
	r.q.waitBehind(l, h, 8, 30*time.Second)
	r.mustNext(t, l, stepDone)
	if r.q.lanes["k/a"] != l {
		t.Fatal("a lane waiting for an earlier event was forgotten")
	}
	_, waiting, _ := r.q.status()
	if len(waiting) != 1 || waiting[0].Behind != 8 || waiting[0].Sequence != 10 {
		t.Fatalf("status waiting %+v", waiting)
	}
	if _, claimed, _ := r.q.tick(); len(claimed) != 0 {
		t.Fatal("the heartbeat restarted a lane before its wait ran out")
	}
	r.clock = r.clock.Add(31 * time.Second)
	msgs, claimed, _ := r.q.tick()
	if len(claimed) != 1 || claimed[0] != l || len(msgs) != 1 {
		t.Fatalf("after the wait: claimed %d lanes, %d messages to heartbeat", len(claimed), len(msgs))
	}
	if s := r.mustNext(t, l, stepRun); s.h.seq != 10 {
		t.Fatalf("ran %d", s.h.seq)
	}

	// The earlier event arriving ends the wait at once, and runs first.
	r2 := newQueueRig(false)
	l2 := r2.mustAdd(t, r2.event("a", 10), true)
	r2.q.waitBehind(l2, r2.mustNext(t, l2, stepRun).h, 8, time.Minute)
	r2.mustNext(t, l2, stepDone)
	if l := r2.mustAdd(t, r2.event("a", 8), true); l != l2 {
		t.Fatal("the earlier event did not join the waiting lane")
	}
	if s := r2.mustNext(t, l2, stepRun); s.h.seq != 8 {
		t.Fatalf("ran %d, want the earlier 8", s.h.seq)
	}
}

func TestQueueLatestWinsRanksThenSupersedesTheHead(t *testing.T) {
	r := newQueueRig(true)
	l := r.mustAdd(t, r.event("a", 1), true)
	r.mustAdd(t, r.event("a", 2), false)
	r.mustAdd(t, r.event("a", 3), false)
	s := r.mustNext(t, l, stepRank)
	if len(s.todo) != 3 {
		t.Fatalf("ranks %d events, want 3", len(s.todo))
	}
	r.q.ranked(s.todo, []rankResult{{rank: 5, ok: true}, {rank: 9, ok: true}, {ok: false}})
	s = r.mustNext(t, l, stepSupersede)
	if s.h.seq != 1 || s.winner.seq != 2 {
		t.Fatalf("superseded %d by %d, want 1 by 2", s.h.seq, s.winner.seq)
	}
	// 2 ranks and 3 does not: 2 is looked at against the stream first.
	s = r.mustNext(t, l, stepCheckNewer)
	if s.h.seq != 2 || !r.q.takeHead(l, s.h) || r.q.takeHead(l, s.h) {
		t.Fatal("the head found superseded in the stream was not taken once")
	}
	// The unranked 3 is neither superseded nor looked at: it runs.
	if s := r.mustNext(t, l, stepRun); s.h.seq != 3 {
		t.Fatalf("ran %d", s.h.seq)
	}
}

func TestQueueRankingFindsAnInvalidEvent(t *testing.T) {
	r := newQueueRig(true)
	l := r.mustAdd(t, r.event("a", 1), true)
	s := r.mustNext(t, l, stepRank)
	r.q.ranked(s.todo, []rankResult{{invalid: errors.New("bad schema")}})
	h := r.mustNext(t, l, stepRun).h
	if !h.invalid || h.ranked || h.deadReason == nil || h.key != "invalid" {
		t.Fatalf("an invalid event after ranking: %+v", h)
	}
}

func TestQueueStoppingClaimsNothingAndHandsEverythingBack(t *testing.T) {
	r := newQueueRig(false)
	running := r.mustAdd(t, r.event("a", 1), true)
	r.mustAdd(t, r.event("a", 2), false)
	r.mustNext(t, running, stepRun)
	claimed := r.mustAdd(t, r.event("b", 3), true)
	r.stopping.Store(true)
	if _, claimed := r.q.add(r.event("c", 4)); claimed != nil {
		t.Fatal("a stopping queue claimed a lane")
	}
	back := r.q.releaseAll()
	if len(back) != 3 {
		t.Fatalf("handed back %d events, want the 3 queued", len(back))
	}
	if r.q.lanes["k/a"] != running || r.q.lanes["k/b"] != claimed || len(r.q.lanes) != 2 {
		t.Fatalf("lanes kept after release: %d; want the two with a runner", len(r.q.lanes))
	}
	r.mustNext(t, running, stepDone)
	r.mustNext(t, claimed, stepDone)
	if len(r.q.lanes) != 0 {
		t.Fatal("the runners of a stopping queue left their lanes behind")
	}
	// Two claims (a and b, none for c): each is a task shutdown waits for.
	r.tasks.Add(-2)
	r.tasks.Wait()
}

// In memory (workertest), a failing head ends its lane's run rather than
// waiting on the clock, the next round starts it again, and once its
// handler has failed maxFailures times it is parked: it keeps its place
// and holds its key, so the event behind it never runs and no round claims
// the lane again.
func TestQueueInRoundsRetriesAfterTheRoundAndParksAtMaxFailures(t *testing.T) {
	r := newQueueRig(false)
	r.q.inRounds, r.q.maxFailures = true, 2
	l := r.mustAdd(t, r.event("a", 1), true)
	r.mustAdd(t, r.event("a", 2), false)

	head := r.mustNext(t, l, stepRun).h
	r.q.retry(l, head, errors.New("down"))
	r.mustNext(t, l, stepDone) // waits for the next round, not the clock
	if l.running {
		t.Fatal("a lane that ended its run is still marked running")
	}
	claimed := r.q.dueInRound()
	if len(claimed) != 1 || claimed[0] != l {
		t.Fatalf("the next round claimed %v, want the failing lane", claimed)
	}
	if s := r.mustNext(t, l, stepRun); s.h != head {
		t.Fatalf("the round ran %d, want the failed head again", s.h.seq)
	}
	r.q.retry(l, head, errors.New("still down"))
	if !head.parked {
		t.Fatalf("after %d failures the head is not parked (maxFailures 2)", head.attempts)
	}
	r.mustNext(t, l, stepDone)
	if claimed := r.q.dueInRound(); len(claimed) != 0 {
		t.Fatalf("a round claimed %d lanes after the head was parked, want none", len(claimed))
	}
	if got := len(r.q.lanes["k/a"].queue); got != 2 {
		t.Fatalf("the parked lane holds %d events, want the head and the one behind it", got)
	}

	// A panic is bounded by WithMaxPanics, not by maxFailures.
	p := r.event("b", 3)
	lb := r.mustAdd(t, p, true)
	r.mustNext(t, lb, stepRun)
	p.panics = 1
	r.q.retry(lb, p, errors.New("panicked"))
	if p.parked {
		t.Fatal("a panic counted towards maxFailures")
	}
}

// A worker never parks and never runs in rounds: a failing head waits on
// the clock for its backoff.
func TestQueueOfAWorkerWaitsOnTheClockAndNeverParks(t *testing.T) {
	r := newQueueRig(false)
	l := r.mustAdd(t, r.event("a", 1), true)
	head := r.mustNext(t, l, stepRun).h
	for range 50 {
		r.q.retry(l, head, errors.New("down"))
		if head.parked {
			t.Fatalf("parked after %d failures", head.attempts)
		}
		if s := r.mustNext(t, l, stepWait); s.wait <= 0 {
			t.Fatalf("wait %v", s.wait)
		}
		r.clock = r.clock.Add(time.Minute)
		r.mustNext(t, l, stepRun)
	}
}
