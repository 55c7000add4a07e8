package workers

import "errors"

// permanentError marks a failure no retry can fix.
type permanentError struct{ err error }

func (p *permanentError) Error() string { return p.err.Error() }
func (p *permanentError) Unwrap() error { return p.err }

// Permanent marks err as a failure no retry can fix (bad input, a bad
// signature, a refusal): the runtime sends the event to the DLQ with err as
// the reason and terminates it, on the first delivery.
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
