package events

// Outcomes are CloudEvents a worker instance publishes on its outcome
// subject, one per event it settles (and more where a handler says more):
// what consoles, `steward history` and audits read. What every reader
// needs to know of them is here.

// OutcomeSubject is where a worker instance's outcomes go.
func OutcomeSubject(worker, instance string) string {
	return OutcomesPrefix + "." + worker + "." + instance
}

// OutcomeType is the CloudEvents type of an outcome:
// dev.steward.<noun>.<outcome>.v1.
func OutcomeType(noun, outcome string) string { return "dev.steward." + noun + "." + outcome + ".v1" }

// OutcomeSuperseded is the outcome the runtime emits for an event settled
// unapplied because a newer verified event of its key was queued behind it.
const OutcomeSuperseded = "superseded"

// Superseded is the data of a superseded outcome.
type Superseded struct {
	Key                  string `json:"key"`
	EventID              string `json:"eventId"`
	Sequence             uint64 `json:"sequence"`
	SupersededBy         string `json:"supersededBy"`
	SupersededBySequence uint64 `json:"supersededBySequence"`
	Reason               string `json:"reason"`
}

// ReplayExtension is the CloudEvents extension attribute every outcome a
// replay emits carries, set to true, beside ReplayIDExtension naming the
// run: a console or `steward history` tells a replayed outcome from the
// live consumer's, and one replay's from another's.
const (
	ReplayExtension   = "replay"
	ReplayIDExtension = "replayid"
)
