package workers

import (
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// taker takes the consumer's messages, one runner at a time: the one
// waiting in Next is the taker. When a message gives a lane work and the
// lane has no runner, the taker hands the waiting to another runner and
// runs that lane itself, so the event reaches its handler on the goroutine
// that received it from nats.go, as a raw consumer's callback does. A lane
// started on a runner of its own cost each such event a wake-up before its
// handler: at 1,000 events/s, about 70µs of the handler's p99.
//
// Only one runner is ever in Next: a taker hands over before it runs a
// lane and is done with the iterator after, and the hand-over (runners.run)
// is what orders one taker's accept before the next one's.
type taker struct {
	c  *consumerSource
	it jetstream.MessagesContext
	// take is loop as a func value, made once rather than per hand-over.
	take func()
	// last is the error Next returned since the last message, if any (the
	// consumer was deleted, say): what ended the iterator, when it closes
	// after one. Only the taker touches it.
	last error
	// done closes once the iterator has closed; err then says why, when
	// serve did not ask for it.
	done chan struct{}
	err  error
}

func newTaker(c *consumerSource, it jetstream.MessagesContext) *taker {
	t := &taker{c: c, it: it, done: make(chan struct{})}
	t.take = t.loop
	return t
}

// loop takes messages until one needs its lane run here, or the iterator
// closes.
func (t *taker) loop() {
	for {
		msg, err := t.it.Next()
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			t.end(err)
			return
		}
		if err != nil {
			// A status the subscription stops on (the consumer deleted)
			// comes back once; the next call says the iterator closed.
			t.last = err
			t.c.log.Debug().Err(err).Msg("pull interrupted")
			// A consumer deleted while no pull of ours was waiting on it
			// sends no status, and a connection closed while nats.go was
			// setting up the subscription closes nothing: either way its
			// heartbeats just stop. Without this check the worker would
			// pull into the void for good.
			if errors.Is(err, jetstream.ErrNoHeartbeat) {
				if gone := t.c.gone(); gone != nil {
					t.last = gone
					t.it.Stop()
				}
			}
			continue
		}
		t.last = nil
		if run := t.c.take(msg); run != nil {
			t.c.runners.run(t.take)
			run()
			return
		}
	}
}

// end records why the iterator closed: nothing, when the worker is
// stopping (serve drained it); otherwise the consumer's end, which makes
// Run return with it.
func (t *taker) end(closed error) {
	c := t.c
	if !c.stopping.Load() {
		var why error
		switch {
		case errors.Is(closed, jetstream.ErrConnectionClosed):
			why = nats.ErrConnectionClosed
		case t.last != nil:
			why = t.last
		case c.js.Conn() != nil && !c.js.Conn().IsClosed():
			why = fmt.Errorf("its subscription ended while NATS is %s", c.js.Conn().Status())
		default:
			why = nats.ErrConnectionClosed
		}
		// Nothing held is lost: what was not acked is redelivered.
		t.err = fmt.Errorf("consumer %s stopped: %w; starting the worker again subscribes anew (and makes the consumer if it is gone), its checkpoints skipping what was applied", c.consumerName(), why)
	}
	close(t.done)
}
