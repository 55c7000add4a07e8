package events_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// SetupBus refuses checkpoint limits the server would read as "none".
func TestSetupBusRefusesUnsetCheckpointLimits(t *testing.T) {
	js := startJS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := events.DefaultBusConfig(1)
	cfg.CheckpointMaxValueSize = 0
	err := events.SetupBus(ctx, js, cfg)
	if err == nil || !strings.Contains(err.Error(), "checkpoint max bytes 4294967296 and max value size 0: want both positive") {
		t.Fatalf("SetupBus with no checkpoint value size: %v", err)
	}
	if _, err := js.KeyValue(ctx, events.CheckpointBucket); err == nil {
		t.Fatal("a refused set-up created the bucket")
	}
}

// A worker's CreateMissingBus creates the bucket with the defaults when it
// is missing, and leaves the limits `steward setup` set alone.
func TestCreateMissingBusKeepsOperatorLimits(t *testing.T) {
	js := startJS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	maxBytes := func(kv jetstream.KeyValue) int64 {
		t.Helper()
		st, err := kv.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.MaxBytes
	}
	kv, err := events.CreateMissingBus(ctx, js, events.DefaultBusConfig(1))
	if err != nil {
		t.Fatal(err)
	}
	if got := maxBytes(kv); got != events.DefaultCheckpointMaxBytes {
		t.Fatalf("a created bucket holds %d bytes, want the default %d", got, events.DefaultCheckpointMaxBytes)
	}
	op := events.DefaultBusConfig(1)
	op.CheckpointMaxBytes = 77 << 20
	if err := events.SetupBus(ctx, js, op); err != nil {
		t.Fatal(err)
	}
	if kv, err = events.CreateMissingBus(ctx, js, events.DefaultBusConfig(1)); err != nil {
		t.Fatal(err)
	}
	if got := maxBytes(kv); got != 77<<20 {
		t.Fatalf("max bytes %d after CreateMissingBus, want the operator's %d", got, 77<<20)
	}
}
