package ops

import (
	"errors"
	"maps"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/proof"
	"github.com/steward-dev/steward/internal/redact"
)

// Proofs is what a view checks outcomes and dead letters with. Any
// identity that may make a request can have JetStream store a message it
// shaped on another instance's outcome or DLQ subject (docs/design.md §7),
// so an outcome or letter is listed as what the instance did only when
// its proof verifies as that instance's; any other is marked forged, and
// kept in the view so the operator sees that someone is forging.
type Proofs struct {
	// Verifier says whose document keys are believed. Nil means the reader
	// has no keys (a tool on an open development bus): entries are marked
	// unverified, never forged.
	Verifier *proof.Verifier
	// Domain is the JetStream domain the streams are in, which every proof
	// binds.
	Domain string
	// LegacyBefore is when the upgrade record was made
	// (events.Store.UpgradedAt): an unsigned message stored before it was
	// written by the version before proofs and is marked unverified, one
	// stored after it is forged. The server stamps the store time, so no
	// writer can backdate a message.
	LegacyBefore time.Time

	// sources are, per stream, the domains it sources from, read by each
	// reader from the stream's configuration as the server reports it
	// (sourcedBy), never from what a message says: an outcome or letter a
	// hub's stream sourced from a site is signed for the site's domain.
	sources map[string]events.SourceDomains
}

// sourcedBy is p knowing the sources of the stream info describes, so a
// message that stream sourced from another domain is verified in that
// domain (events.SourceDomains.ProofDomain).
func (p Proofs) sourcedBy(info *jetstream.StreamInfo) Proofs {
	if info == nil {
		return p
	}
	sources := maps.Clone(p.sources)
	if sources == nil {
		sources = map[string]events.SourceDomains{}
	}
	sources[info.Config.Name] = events.SourceDomainsOf(info.Config)
	p.sources = sources
	return p
}

// domain is the domain a message of stream, stored on subject with
// headers h, is verified in: the one function every reader's check goes
// through.
func (p Proofs) domain(stream, subject string, h nats.Header) string {
	return p.sources[stream].ProofDomain(p.Domain, subject, h)
}

// ProofsOf checks with what the operator's store of the checkpoint bucket
// believes; a nil store checks nothing.
func ProofsOf(s *events.Store) Proofs {
	if s == nil {
		return Proofs{}
	}
	return Proofs{Verifier: s.Verifier(), Domain: s.Domain(), LegacyBefore: s.UpgradedAt()}
}

// ForgedNote is what an operator does about a forged entry, for the
// footers of `steward history`, `steward dlq ls` and the console.
const ForgedNote = "an entry marked FORGED was not written by the instance its subject names: some identity made the bus store it (a request whose reply subject was that instance's, docs/design.md §7). It says nothing about what the instance did: find the identity from the reason (where it was reflected from), revoke its credentials, then remove forged dead letters with steward dlq rm"

// outcome checks an outcome stored on subject at stored, with headers h
// and payload data. It returns why it is forged ("" when it verified), or
// unverified when it cannot be checked.
func (p Proofs) outcome(subject string, stored time.Time, h nats.Header, data []byte, e event.Event) (forged string, unverified bool) {
	if p.Verifier == nil {
		return "", true
	}
	return p.judge(stored, events.VerifyOutcome(p.Verifier, p.domain(events.StreamOutcomes, subject, h), subject, h, data, e))
}

// letter checks a dead letter stored at stored as outcome does an outcome.
func (p Proofs) letter(d events.DeadLetter, stored time.Time) (forged string, unverified bool) {
	if p.Verifier == nil {
		return "", true
	}
	return p.judge(stored, d.VerifyProof(p.Verifier, p.domain(events.StreamDLQ, d.DLQSubject, d.Headers)))
}

func (p Proofs) judge(stored time.Time, err error) (forged string, unverified bool) {
	switch {
	case err == nil:
		return "", false
	case errors.Is(err, proof.ErrUnsigned) && !p.LegacyBefore.IsZero() && stored.Before(p.LegacyBefore):
		return "", true
	}
	return redact.Line(err.Error()), false
}
