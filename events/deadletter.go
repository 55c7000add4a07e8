package events

import (
	"strconv"
	"strings"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
)

// Headers a dead letter carries besides the original event's.
const (
	// HeaderError is why the event could not be processed.
	HeaderError = "Steward-Error"
	// HeaderWorker is the consumer that dead-lettered it, <worker>-<instance>.
	HeaderWorker = "Steward-Worker"
	// HeaderStreamSeq is the event's sequence in STEWARD_EVENTS.
	HeaderStreamSeq = "Steward-Stream-Seq"
	// HeaderDelivered is how many deliveries it had.
	HeaderDelivered = "Steward-Deliveries"
	// HeaderSubject is the NATS subject the event was stored on.
	HeaderSubject = "Steward-Subject"
)

// DLQSubject is where a worker instance's dead letters go.
func DLQSubject(worker, instance string) string { return DLQPrefix + "." + worker + "." + instance }

// OutcomeSubject is where a worker instance's outcomes go.
func OutcomeSubject(worker, instance string) string {
	return OutcomesPrefix + "." + worker + "." + instance
}

// OutcomeType is the CloudEvents type of an outcome:
// dev.steward.<noun>.<outcome>.v1.
func OutcomeType(noun, outcome string) string { return "dev.steward." + noun + "." + outcome + ".v1" }

// DeadLetter is one message of STEWARD_DLQ read back: the original event
// (when it decodes) and what the worker said about it. It is the one
// parser of the dead-letter format; `steward dlq`, workertest and the
// end-to-end tests all read dead letters through it.
type DeadLetter struct {
	// DLQSequence is the letter's own sequence in STEWARD_DLQ, and
	// DLQSubject the subject it was stored on.
	DLQSequence uint64
	DLQSubject  string
	// Event is the original event, or nil when it could not be decoded
	// (which may be why it is here).
	Event *event.Event
	// Reason is the Steward-Error header.
	Reason string
	// Worker is the consumer that wrote it, <worker>-<instance>.
	Worker string
	// Subject is the original event's NATS subject, as the worker read it.
	Subject string
	// Sequence is the original event's sequence in STEWARD_EVENTS.
	Sequence uint64
	// Delivered is how many deliveries it had.
	Delivered int
	Headers   nats.Header
	Data      []byte
}

// ParseDeadLetter reads a message of STEWARD_DLQ. It never fails: a field
// whose header is missing or unreadable is left zero, so an operator still
// sees what there is.
func ParseDeadLetter(dlqSeq uint64, subject string, h nats.Header, data []byte) DeadLetter {
	d := DeadLetter{
		DLQSequence: dlqSeq, DLQSubject: subject, Headers: h, Data: data,
		Reason: h.Get(HeaderError), Worker: h.Get(HeaderWorker), Subject: h.Get(HeaderSubject),
	}
	d.Sequence, _ = strconv.ParseUint(h.Get(HeaderStreamSeq), 10, 64)
	d.Delivered, _ = strconv.Atoi(h.Get(HeaderDelivered))
	if e, err := Decode(h, data); err == nil {
		d.Event = &e
	}
	return d
}

// EventID is the original event's id, read from its headers even when the
// event does not decode.
func (d DeadLetter) EventID() string {
	if d.Event != nil {
		return d.Event.ID()
	}
	for k, v := range d.Headers {
		if strings.EqualFold(k, "ce-id") && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}
