package workers

import (
	"strconv"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
)

func eventWithID(id string) event.Event {
	e := event.New()
	e.SetID(id)
	return e
}

// TestARunIsFullAtItsSizeOrItsAge drives a run with a fake clock: it takes
// events until it holds maxBatch, or until its first event's handler
// started maxBatchAge ago, and the view the next event gets counts every
// event of the run as settled.
func TestARunIsFullAtItsSizeOrItsAge(t *testing.T) {
	clock := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	b := &batch{}
	if _, _, ok := b.view(); ok {
		t.Fatal("an empty run has a view")
	}
	stored := checkpoint{Applied: 3, StageSeq: 4}
	for i := range maxBatch {
		b.starting(clock.Add(time.Duration(i) * time.Millisecond))
		b.add(&held{seq: uint64(4 + i), event: eventWithID("e" + strconv.Itoa(i))}, resultApplied, stored, 9)
		if full := b.full(clock.Add(time.Duration(i) * time.Millisecond)); full != (i == maxBatch-1) {
			t.Fatalf("after %d events full is %v", i+1, full)
		}
	}
	cp, rev, ok := b.view()
	if !ok || cp.Applied != uint64(3+maxBatch) || cp.EventID != "e"+strconv.Itoa(maxBatch-1) || rev != 9 {
		t.Fatalf("the view of a run of %d events from sequence 4 is %+v at revision %d", maxBatch, cp, rev)
	}

	b = &batch{}
	b.starting(clock)
	b.add(&held{seq: 7, event: eventWithID("slow")}, resultApplied, stored, 9)
	if b.full(clock.Add(maxBatchAge - time.Millisecond)) {
		t.Fatal("a run of one fast event is full")
	}
	if !b.full(clock.Add(maxBatchAge)) {
		t.Fatal("a run whose first handler started maxBatchAge ago is not full")
	}
	b.starting(clock.Add(time.Hour)) // a later event of the run does not reset its age
	if !b.full(clock.Add(maxBatchAge)) {
		t.Fatal("a later event reset the run's age")
	}
}
