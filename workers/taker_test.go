package workers_test

import (
	"context"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// TestAHandlerRunsWhereItsEventWasTaken checks what the steady rate's
// latency rests on: an event whose lane was idle is handled on the
// goroutine that took it from nats.go, with no wake-up of another between
// the two.
func TestAHandlerRunsWhereItsEventWasTaken(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	stacks := make(chan string, 1)
	r := workertest.Start(t, js, spec("taker"), workers.HandlerFunc(func(context.Context, *workers.Delivery) error {
		select {
		case stacks <- string(debug.Stack()):
		default:
		}
		return nil
	}))
	publishRotation(t, js, "hive-1", 1)
	workertest.WaitIdle(t, js, r.ConsumerName())
	select {
	case stack := <-stacks:
		if !strings.Contains(stack, "workers.(*taker).loop") {
			t.Fatalf("the handler ran on a goroutine that did not take the event:\n%s", stack)
		}
	case <-time.After(workertest.DefaultTimeout):
		t.Fatal("the handler never ran")
	}
}

// TestABlockedHandlerDoesNotStopTaking runs one key's handler until another
// key's event, published only once the first handler is running, has been
// handled: the goroutine running the first handler took its event, so
// another must have gone on taking.
func TestABlockedHandlerDoesNotStopTaking(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	first, second := make(chan struct{}), make(chan struct{})
	r := workertest.Start(t, js, spec("taking"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		switch d.Key {
		case "hive-1":
			close(first)
			select {
			case <-second:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		default:
			close(second)
			return nil
		}
	}))
	publishRotation(t, js, "hive-1", 1)
	select {
	case <-first:
	case <-time.After(workertest.DefaultTimeout):
		t.Fatal("the first key's handler never ran")
	}
	publishRotation(t, js, "hive-2", 1)
	workertest.WaitIdle(t, js, r.ConsumerName())
	select {
	case <-second:
	default:
		t.Fatal("the worker went idle without handling the second key")
	}
}
