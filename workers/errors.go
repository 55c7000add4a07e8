package workers

import "errors"

// The package's sentinel errors, for errors.Is.
var (
	// ErrInvalidSpec marks a Spec or options New refuses: no retry fixes
	// it.
	ErrInvalidSpec = errors.New("invalid worker spec")
	// ErrUnranked is what a Rank returns for an event that takes part in
	// no latest-wins choice (another kind of event of the same worker).
	ErrUnranked = errors.New("the event takes part in no latest-wins choice")
	// ErrUntrusted says a state document is there but does not verify as
	// this instance's (docs/design.md §7): it is not believed, and the
	// handler treats it as absent, rebuilding what it said from signed
	// evidence. The revision returned with it lets a Put replace it.
	ErrUntrusted = errors.New("does not verify as this instance's own, so it is not believed")
)

// permanentError marks a failure no retry can fix.
type permanentError struct{ err error }

func (p *permanentError) Error() string { return p.err.Error() }
func (p *permanentError) Unwrap() error { return p.err }

// Permanent marks err as a failure no retry can fix and that is not a
// policy decision (undecodable data, a handler bug it detects): the runtime
// sends the event to the DLQ with err as the reason and terminates it, on
// the first delivery. A policy refusal is Refused, not Permanent.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or an error it wraps, was marked Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// refusedError marks a policy refusal the handler has already reported.
type refusedError struct{ err error }

func (r *refusedError) Error() string { return r.err.Error() }
func (r *refusedError) Unwrap() error { return r.err }

// Refused marks err as a policy refusal: the event was read and understood,
// and the worker's rules say no (a downgrade, a bad signature, an invitation
// for another box, a stale version). The handler emits its refused outcome
// with the rule and the reason before it returns Refused; the runtime then
// settles the event like an applied one (the checkpoint moves past it, the
// ack is confirmed) and counts it as refused. A refusal is never a dead
// letter: sending it back would only be refused again.
func Refused(err error) error {
	if err == nil {
		return nil
	}
	return &refusedError{err: err}
}

// IsRefused reports whether err, or an error it wraps, was marked Refused.
func IsRefused(err error) bool {
	var r *refusedError
	return errors.As(err, &r)
}
