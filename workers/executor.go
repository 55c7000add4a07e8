package workers

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/steward-dev/steward/internal/redact"
)

// executor runs the worker's handler on one delivery and classifies what it
// returned, by the rules the package documentation gives: nil is applied,
// Refused is refused (both settle the event), Permanent goes to the DLQ, a
// panic is retried until it has happened WithMaxPanics times and then goes
// to the DLQ, any other error is retried, and whatever a stopping worker
// cut short is given back. The runtime and a replay both run handlers
// through it.
type executor struct {
	handler   Handler
	maxPanics int
	// panics counts the handler's panics (steward_handler_panics_total).
	panics prometheus.Counter
}

// fate is what becomes of a delivery whose handler did not settle it.
type fate int

const (
	// fateRetry: tried again after its backoff, in this process.
	fateRetry fate = iota
	// fateDead: sent to the DLQ with the reason classify returns.
	fateDead
	// fateReleased: given back unfinished (the worker is stopping), for
	// an immediate redelivery.
	fateReleased
)

// panicError is a handler panic turned into a failure.
type panicError struct{ msg string }

func (p *panicError) Error() string { return p.msg }

// call runs the handler and turns a panic into an ordinary failure.
func (x *executor) call(ctx context.Context, d *Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			x.panics.Inc()
			d.Log.Error().Str("panic", redact.Line(fmt.Sprint(r))).Str("stack", string(debug.Stack())).Msg("handler panicked")
			err = &panicError{msg: fmt.Sprintf("handler panicked on %s (event %s): %v", d.Key, d.Event.ID(), r)}
		}
	}()
	return x.handler.Handle(ctx, d)
}

// handle runs the handler on d and returns the result that settles the
// event (applied, or refused), or the error for classify.
func (x *executor) handle(ctx context.Context, d *Delivery) (string, error) {
	err := x.call(ctx, d)
	switch {
	case err == nil:
		return resultApplied, nil
	case IsRefused(err):
		// A refusal settles the event as an application does: its
		// outcome is out, and a redelivery would be refused again.
		d.Log.Info().Str("reason", redact.Line(err.Error())).Msg("event refused by the worker's rules")
		return resultRefused, nil
	}
	return "", err
}

// classify says what becomes of h, whose handler (run under ctx) failed
// with err, and the reason it goes to the DLQ with. It counts h's panics.
func (x *executor) classify(ctx context.Context, h *held, err error) (fate, error) {
	var p *panicError
	switch {
	case ctx.Err() != nil:
		return fateReleased, nil
	case IsPermanent(err):
		return fateDead, err
	case errors.As(err, &p):
		if h.panics++; h.panics >= x.maxPanics {
			return fateDead, Permanent(fmt.Errorf("the handler panicked %d times, the last with: %w", h.panics, err))
		}
	}
	return fateRetry, err
}
