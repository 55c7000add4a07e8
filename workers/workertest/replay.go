package workertest

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers"
)

// ReplayFile replays a recorded stream, CloudEvents in the JSON format one
// per line as `steward export` writes them, through h for a worker of spec,
// and returns what it did. It runs in memory (see Runner for what that
// models) unless WithRuntime asks for the real runtime on an embedded
// server.
func ReplayFile(t testing.TB, path string, spec workers.Spec, h workers.Handler, opts ...Option) *Result {
	t.Helper()
	return Replay(t, ReadFile(t, path), spec, h, opts...)
}

// Replay is ReplayFile with the events given.
func Replay(t testing.TB, list []event.Event, spec workers.Spec, h workers.Handler, opts ...Option) *Result {
	t.Helper()
	c := newConfig(opts)
	if !c.runtime {
		return newRunner(t, spec, h, c).WorkAll(list)
	}
	return replayOnServer(t, list, spec, h, c)
}

// replayOnServer publishes the stream to a fresh embedded server and runs
// the runtime over it until every event has settled, gone to the DLQ, or
// failed as many times as WithAttempts allows (a failure the runtime retries
// for as long as it lasts, so waiting for it to settle could take for ever).
func replayOnServer(t testing.TB, list []event.Event, spec workers.Spec, h workers.Handler, c config) *Result {
	t.Helper()
	js := StartServer(t).JetStream(t)
	var (
		mu      sync.Mutex
		settled = map[uint64]Verdict{}
		tried   = map[uint64]Settled{}
		stages  []Stage
	)
	observed := workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		err := h.Handle(ctx, d)
		// The Delivery's stage is the last one this run saved.
		var stage json.RawMessage
		ok, _ := d.LoadStage(&stage)
		mu.Lock()
		defer mu.Unlock()
		if ok {
			stages = append(stages, Stage{Sequence: d.Sequence, EventID: d.Event.ID(), Stage: stage})
		}
		s := tried[d.Sequence]
		s.Attempts++
		s.Err = err
		tried[d.Sequence] = s
		return err
	})
	opts := append([]workers.Option{
		workers.WithLogger(c.log),
		workers.WithMaxPanics(c.maxPanics),
		workers.WithSettledHook(func(s workers.Settlement) {
			mu.Lock()
			defer mu.Unlock()
			settled[s.Sequence] = Verdict(s.Result)
		}),
	}, c.runtimeOpt...)
	// Published as the stream recorded them, past the publisher's
	// validation, so an invalid event reaches the runtime's DLQ as a
	// hostile one would.
	list = slices.Clone(list)
	seqs := make([]uint64, len(list))
	// Events on subjects the worker does not consume are never delivered:
	// nothing waits for them.
	undelivered := map[uint64]bool{}
	for i := range list {
		prepare(&list[i])
		msg, err := events.Encode(subjectOf(spec, list[i]), list[i])
		if err != nil {
			t.Fatalf("event %s: %v", list[i].ID(), err)
		}
		ack, err := js.PublishMsg(context.Background(), msg)
		if err != nil {
			t.Fatalf("publish %s: %v", list[i].ID(), err)
		}
		seqs[i] = ack.Sequence
		if !consumes(spec, msg.Subject) {
			undelivered[ack.Sequence] = true
		}
	}
	run := Start(t, js, spec, observed, opts...)
	noun := spec.OutcomeNoun
	if noun == "" {
		noun = spec.Name
	}
	var dead map[uint64]int
	res := &Result{t: t}
	WaitUntil(t, "every replayed event is settled, dead-lettered or out of attempts", func() bool {
		res.DeadLetters = DeadLetters(t, js, spec.Name, spec.Instance)
		dead = map[uint64]int{}
		for i, d := range res.DeadLetters {
			dead[d.Sequence] = i
		}
		mu.Lock()
		defer mu.Unlock()
		for _, seq := range seqs {
			if undelivered[seq] {
				continue
			}
			_, s := settled[seq]
			_, d := dead[seq]
			if a, ok := tried[seq]; !s && !d && (!ok || a.Err == nil || workers.IsRefused(a.Err) || a.Attempts < c.attempts) {
				return false
			}
		}
		return true
	})
	if err := run.Stop(); err != nil {
		t.Fatalf("worker %s: %v", run.ConsumerName(), err)
	}
	res.Outcomes = Outcomes(t, js, spec.Name, spec.Instance)
	mu.Lock()
	defer mu.Unlock()
	for i, e := range list {
		seq := seqs[i]
		s := tried[seq]
		s.Sequence, s.ID, s.Type, s.Key = seq, e.ID(), e.Type(), e.Subject()
		if spec.OrderKey != nil {
			s.Key = spec.OrderKey(e)
		}
		switch v, ok := settled[seq]; {
		case undelivered[seq]:
			s.Verdict = Undelivered
		case ok:
			s.Verdict = v
			if v == Applied || v == Superseded || v == Skipped {
				s.Err = nil
			}
		default:
			if j, ok := dead[seq]; ok {
				s.Verdict = DeadLettered
				if s.Err == nil {
					s.Err = workers.Permanent(errorText(res.DeadLetters[j].Reason))
				}
			} else {
				s.Verdict = Retried
			}
		}
		res.Events = append(res.Events, s)
	}
	res.Stages = stages
	docs, err := run.State().Documents(context.Background())
	if err != nil {
		t.Fatalf("state of %s: %v", run.ConsumerName(), err)
	}
	res.State = docs
	return res
}
