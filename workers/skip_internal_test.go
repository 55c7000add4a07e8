package workers

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers/internal/enginetest"
	"github.com/steward-dev/steward/workers/internal/memory"
)

// TestASkipOnAnUnrecordedRunIsAckedOnlyOnceTheRunIsRecorded hands a lane an
// older event of a key after a newer one was applied in the same run, whose
// checkpoint is not written yet, as a redelivery from a killed process
// does. The older one is skipped, and its ack must wait for the run's
// write: acked first, a kill before the write would leave it acked above
// the stored checkpoint, where the order scan takes it for an event
// another process holds and keeps the key's later events waiting behind
// it. With the bucket away, the older one is not acked and, retried, is
// recorded as skipped, never handled (which would roll the key back).
func TestASkipOnAnUnrecordedRunIsAckedOnlyOnceTheRunIsRecorded(t *testing.T) {
	kv := memory.NewKV(events.CheckpointBucket)
	var handled atomic.Int32
	eng, err := newMemoryEngine(enginetest.Config{
		Spec: Spec{Name: "skip", Instance: "i1", Subjects: []string{events.EventsPrefix + ".credential.rotated.>"}, Types: []string{events.TypeCredentialRotated}},
		Handler: HandlerFunc(func(context.Context, *Delivery) error {
			handled.Add(1)
			return nil
		}),
		KV: kv, Streams: memory.NewStreams(),
	})
	if err != nil {
		t.Fatal(err)
	}
	w := eng.(*memoryEngine).w
	delivery := func(seq, version, delivered uint64) *held {
		e := event.New()
		e.SetID("rot-" + string(rune('0'+version)))
		e.SetType(events.TypeCredentialRotated)
		e.SetSource("/test")
		e.SetSubject("h1")
		if err := e.SetData(events.ContentTypeJSON, events.CredentialRotated{
			Hive: "h1", Version: version, ClientID: "client",
			Secret: "-----BEGIN AGE ENCRYPTED FILE-----\nnot-a-real-secret\n-----END AGE ENCRYPTED FILE-----\n",
		}); err != nil {
			t.Fatal(err)
		}
		msg, err := events.Encode(events.EventsPrefix+".credential.rotated.h1", e)
		if err != nil {
			t.Fatal(err)
		}
		m := memory.NewMsg(&jetstream.RawStreamMsg{Subject: msg.Subject, Sequence: seq, Header: msg.Header, Data: msg.Data}, delivered)
		return &held{msg: m, event: e, key: "h1", lane: laneOf(e.Type(), "h1"), seq: seq, delivered: delivered}
	}
	settled := func(h *held) memory.Settle {
		s, _ := h.msg.(*memory.Msg).Settled()
		return s
	}

	l := newLane()
	l.name = laneOf(events.TypeCredentialRotated, "h1")
	b := &batch{lane: l}
	newer := delivery(5, 2, 1)
	if v := w.process(newer, b); !v.batched || handled.Load() != 1 {
		t.Fatalf("the newer event: verdict %+v, handled %d times; want it applied into the run", v, handled.Load())
	}
	kv.Fail = func(string) error { return errors.New("the bucket is away") }
	older := delivery(3, 1, 2)
	v := w.process(older, b)
	w.settler.acks.Wait()
	if s := settled(older); s == memory.Acked {
		t.Fatal("the older event was acked while the run that makes it stale was not recorded")
	}
	if v.retry == nil {
		t.Fatalf("verdict %+v with the run's write failing; want the older event retried", v)
	}

	// The bucket back, the lane takes both again in its order (the
	// older first), each recorded as it was settled, neither handled again.
	kv.Fail = nil
	for _, h := range []*held{older, newer} {
		if v := w.process(h, b); v.retry != nil {
			t.Fatalf("event %d retried with the bucket back: %v", h.seq, v.retry)
		}
	}
	if err := w.flush(b); err != nil {
		t.Fatal(err)
	}
	w.settler.acks.Wait() // the last ack is confirmed off the lane
	if handled.Load() != 1 {
		t.Fatalf("handled %d times; the older event must be skipped, never handled", handled.Load())
	}
	if s, n := settled(older), settled(newer); s != memory.Acked || n != memory.Acked {
		t.Fatalf("the older event is %q and the newer %q once recorded; want both acked", s, n)
	}
	cp, _, _, err := w.cps.read(context.Background(), l.name)
	if err != nil || cp.Applied != newer.seq {
		t.Fatalf("the checkpoint after both: %+v (%v), want sequence %d applied", cp, err, newer.seq)
	}
}
