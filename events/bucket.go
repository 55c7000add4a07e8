package events

import (
	"encoding/base32"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// CheckpointBucket is the KV bucket that holds, per worker instance, every
// document the runtime and its handlers keep (docs/design.md §3). This file
// is the bucket's one home: every key below is made here, and every
// document is read and written through Store, which signs and verifies it.
const CheckpointBucket = "STEWARD_CHECKPOINTS"

// Defaults of the checkpoint bucket's limits, set explicitly like the
// streams' (a limit left to the server is one the server may change).
const (
	// DefaultCheckpointMaxBytes bounds STEWARD_CHECKPOINTS. A checkpoint is
	// a few hundred bytes per key and instance; a fleet of ten thousand
	// hosts with a hundred keys each fits many times over.
	DefaultCheckpointMaxBytes = 4 << 30
	// DefaultCheckpointMaxValueSize bounds one checkpoint with the stage
	// its handler saved.
	DefaultCheckpointMaxValueSize = 1 << 20
)

// checkpointBucketConfig is the bucket as `steward setup` makes it
// (BusConfig) and a worker creates it when it is missing.
func checkpointBucketConfig(replicas int, maxBytes int64, maxValueSize int32) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:       CheckpointBucket,
		Description:  "Steward workers' checkpoints and state",
		Storage:      jetstream.FileStorage,
		Replicas:     replicas,
		MaxBytes:     maxBytes,
		MaxValueSize: maxValueSize,
	}
}

// The bucket's keys. Every key but the upgrade record starts with a
// worker instance's prefix, so the permission table can give an instance
// its own keys and nothing else (internal/natsauth):
//
//	cp.<worker>.<instance>.<kind>.<key>   checkpoint (and the stage saved for its event)
//	cp.<worker>.<instance>._cursor        the stream reader's cursor
//	cp.<worker>.<instance>._paused        a stream reader's pause (written by an operator)
//	st.<worker>.<instance>.<name>         a handler's state document (converge's "installed")
//	rt.<worker>.<instance>                the instance's status document
//	op.upgrade                            the bucket's sequence when signatures began
const (
	checkpointPrefix = "cp."
	statePrefix      = "st."
	statusPrefix     = "rt."
	// UpgradeKey is where `steward setup` records, signed by the
	// operator, the bucket's sequence when this version first set it up:
	// unsigned documents at or below it were written by the version
	// before, and are read once and signed again; an unsigned document
	// above it was written by no Steward and is not believed.
	UpgradeKey = "op.upgrade"
	cursorName = "_cursor"
	pauseName  = "_paused"
)

// DocKind is the kind of a document in the bucket: what it is for, and so
// what a reader falls back to when it does not verify (docs/design.md §7).
type DocKind string

// The document kinds.
const (
	// KindCheckpoint: the last settled sequence of a key, and the stage
	// of the event being worked on. Untrusted, it counts as absent: the
	// key's events are read and decided again (handlers are idempotent),
	// and a stage is discarded.
	KindCheckpoint DocKind = "checkpoint"
	// KindCursor: how far a stream reader has settled each subject.
	// Untrusted, the reader reads again what its keys' checkpoints need.
	KindCursor DocKind = "cursor"
	// KindPause: a stream reader's pause. Untrusted, it is ignored.
	KindPause DocKind = "pause"
	// KindState: a handler's document (converge's installed version).
	// Untrusted, the handler is told it is absent and rebuilds it from
	// signed evidence, or holds.
	KindState DocKind = "state"
	// KindStatus: what an instance is retrying and waiting for.
	// Untrusted, tools show it as forged, not as fact.
	KindStatus DocKind = "status"
	// KindUpgrade: the upgrade record. Untrusted, no unsigned document is
	// believed.
	KindUpgrade DocKind = "upgrade"
	// KindUnknown: a key outside the layout above.
	KindUnknown DocKind = "unknown"
)

// DocKinds lists every kind, for metrics and tests.
var DocKinds = []DocKind{KindCheckpoint, KindCursor, KindPause, KindState, KindStatus, KindUpgrade, KindUnknown}

// kvToken turns a key into something a KV key may hold. Subject tokens pass
// as they are; anything else (a version with '+') is base32-encoded behind a
// prefix no token starts with.
func kvToken(key string) string {
	if CheckKey(key) == nil {
		return key
	}
	return "_" + strings.ToLower(base32.HexEncoding.WithPadding(base32.NoPadding).EncodeToString([]byte(key)))
}

// Lane names what orders and checkpoints an event: its kind and its order
// key, so a box and a deployment that share a name never share a
// checkpoint. It is the part of a checkpoint key after the instance.
func Lane(typ, key string) string {
	kind := strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(typ, "dev.steward."), ".v1"), ".", "-")
	return kvToken(kind) + "." + kvToken(key)
}

// InstancePrefix is the start of every key of one worker instance's
// checkpoints ("cp.<worker>.<instance>."), state documents and status.
func instanceKey(prefix, worker, instance string) string { return prefix + worker + "." + instance }

// CheckpointKey is the key under which an instance of a worker keeps its
// checkpoint for the events of type typ and order key key:
// cp.<worker>.<instance>.<kind>.<key>, the kind being the type without
// dev.steward. and .v1, dots as dashes, and a kind or key that is not a
// subject token base32-encoded behind '_'. instance may be "*" in a watch
// filter over every instance.
func CheckpointKey(worker, instance, typ, key string) string {
	return LaneCheckpointKey(worker, instance, Lane(typ, key))
}

// LaneCheckpointKey is the checkpoint key of a lane (Lane).
func LaneCheckpointKey(worker, instance, lane string) string {
	return instanceKey(checkpointPrefix, worker, instance) + "." + lane
}

// CheckpointFilter matches every checkpoint, cursor and pause key of
// worker's instances; instance may be "*".
func CheckpointFilter(worker, instance string) string {
	return instanceKey(checkpointPrefix, worker, instance) + ".>"
}

// CursorKey is where a stream-reading worker instance keeps its cursor.
func CursorKey(worker, instance string) string {
	return instanceKey(checkpointPrefix, worker, instance) + "." + cursorName
}

// PauseKey is where a stream-reading instance's pause is kept. It sits
// among the instance's checkpoints, which the instance may write, so only
// the operator's signature makes a pause real.
func PauseKey(worker, instance string) string {
	return instanceKey(checkpointPrefix, worker, instance) + "." + pauseName
}

// StateKey is where a handler's state document name is kept.
func StateKey(worker, instance, name string) string {
	return StatePrefix(worker, instance) + name
}

// StatePrefix is the start of every state document key of an instance.
func StatePrefix(worker, instance string) string {
	return instanceKey(statePrefix, worker, instance) + "."
}

// StatusKey is where an instance's status document is kept.
func StatusKey(worker, instance string) string { return instanceKey(statusPrefix, worker, instance) }

// StatusFilter matches the status documents of worker (every worker when
// empty).
func StatusFilter(worker string) string {
	if worker == "" {
		return statusPrefix + ">"
	}
	return statusPrefix + worker + ".*"
}

// InstanceKeys are the key patterns an instance may write (the permission
// table grants exactly these).
func InstanceKeys(worker, instance string) []string {
	return []string{CheckpointFilter(worker, instance), StatePrefix(worker, instance) + ">", StatusKey(worker, instance)}
}

// KeyInfo is what a key of the bucket says about its document.
type KeyInfo struct {
	Kind DocKind
	// Worker and Instance own the key (empty for the upgrade record).
	Worker, Instance string
	// Writer is the only identity whose signature a reader believes for
	// the key: the instance ("<worker>-<instance>"), or "operator" for a
	// pause and the upgrade record.
	Writer string
}

// OperatorWriter names the operator as a writer of documents.
const OperatorWriter = "operator"

// InfoOf reads a key of the bucket.
func InfoOf(key string) KeyInfo {
	if key == UpgradeKey {
		return KeyInfo{Kind: KindUpgrade, Writer: OperatorWriter}
	}
	parts := strings.SplitN(key, ".", 4)
	if len(parts) < 3 {
		return KeyInfo{Kind: KindUnknown}
	}
	info := KeyInfo{Worker: parts[1], Instance: parts[2], Writer: parts[1] + "-" + parts[2]}
	switch {
	case parts[0] == "rt" && len(parts) == 3:
		info.Kind = KindStatus
	case parts[0] == "st" && len(parts) == 4:
		info.Kind = KindState
	case parts[0] == "cp" && len(parts) == 4 && parts[3] == cursorName:
		info.Kind = KindCursor
	case parts[0] == "cp" && len(parts) == 4 && parts[3] == pauseName:
		info.Kind, info.Writer = KindPause, OperatorWriter
	case parts[0] == "cp" && len(parts) == 4:
		info.Kind = KindCheckpoint
	default:
		return KeyInfo{Kind: KindUnknown}
	}
	return info
}
