package events

import (
	"encoding/json"
	"time"
)

// The documents of the checkpoint bucket. Their JSON is the stored format,
// read by every version since the first: add fields, never rename them.
// Each is stored with its writer's proof as its last member ("proof",
// internal/proof), which older versions ignore.

// Checkpoint is what the runtime keeps per worker instance and order key:
// the last stream sequence settled (applied, refused, superseded or
// dead-lettered), and the stage a handler saved for the event it is working
// on.
type Checkpoint struct {
	Applied  uint64          `json:"applied"`
	EventID  string          `json:"eventId,omitempty"`
	StageSeq uint64          `json:"stageSeq,omitempty"`
	Stage    json.RawMessage `json:"stage,omitempty"`
}

// Cursor is a stream reader's durable progress: per subject, the stream
// sequence up to which every event has been settled.
type Cursor struct {
	Subjects map[string]uint64 `json:"subjects"`
}

// Pause is a stream reader's pause: it reads nothing until Until. Only an
// operator's signature makes one real.
type Pause struct {
	Until time.Time `json:"until"`
}

// Upgrade is the upgrade record (UpgradeKey).
type Upgrade struct {
	// Sequence is the bucket's last sequence when the record was made:
	// unsigned documents at or below it are the previous version's.
	Sequence uint64    `json:"sequence"`
	At       time.Time `json:"at"`
}

// Status is the document a worker instance keeps under StatusKey: the keys
// it is retrying, the keys waiting behind an earlier event held elsewhere,
// and the documents it found forged, so `steward status` can say what is
// stuck and why without asking the server about every consumer. It is
// written at most every status interval, and only when it changed; errors
// in it have secrets elided.
type Status struct {
	Worker    string        `json:"worker"`
	Instance  string        `json:"instance"`
	Process   string        `json:"process"`
	UpdatedAt time.Time     `json:"updatedAt"`
	Stopped   bool          `json:"stopped,omitempty"`
	Retrying  []RetryingKey `json:"retrying"`
	Waiting   []WaitingKey  `json:"waiting"`
	// Forged counts, by kind, the documents of this instance that did not
	// verify since the process started; Forgeries are the latest few.
	Forged    map[DocKind]uint64 `json:"forged,omitempty"`
	Forgeries []Forgery          `json:"forgeries,omitempty"`
}

// RetryingKey is a key whose event failed and is retried.
type RetryingKey struct {
	Key          string    `json:"key"`
	EventID      string    `json:"eventId"`
	Sequence     uint64    `json:"sequence"`
	Attempt      uint64    `json:"attempt"`
	FirstFailure time.Time `json:"firstFailure"`
	NextAttempt  time.Time `json:"nextAttempt"`
	LastError    string    `json:"lastError"`
}

// WaitingKey is a key whose next event waits for an earlier one.
type WaitingKey struct {
	Key      string    `json:"key"`
	EventID  string    `json:"eventId"`
	Sequence uint64    `json:"sequence"`
	Behind   uint64    `json:"behind"`
	Since    time.Time `json:"since"`
}

// Forgery is a document that did not verify: where it is, what it is, why
// it was not believed, and where it came from when the stored message says
// (the key or stream a reflected answer was read from names the identity
// that made the request).
type Forgery struct {
	Key           string    `json:"key"`
	Kind          DocKind   `json:"kind"`
	Revision      uint64    `json:"revision"`
	Reason        string    `json:"reason"`
	ReflectedFrom string    `json:"reflectedFrom,omitempty"`
	SeenAt        time.Time `json:"seenAt"`
}
