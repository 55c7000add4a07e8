package events_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers/workertest"
)

// startJS is an embedded JetStream server of its own, as every package's
// tests start one (workertest.StartServer).
func startJS(t *testing.T) jetstream.JetStream {
	t.Helper()
	return workertest.StartServer(t).JetStream(t)
}

// Every stream sets its limits itself, and discards new messages at them.
func TestStreamConfigsSetEveryLimit(t *testing.T) {
	for _, sc := range events.DefaultStreamConfig().StreamConfigs() {
		if sc.MaxConsumers < 1 || sc.MaxBytes < 1 || sc.MaxMsgSize < 1 || sc.MaxAge <= 0 {
			t.Errorf("stream %s leaves a limit to the server: consumers %d, bytes %d, message size %d, age %v",
				sc.Name, sc.MaxConsumers, sc.MaxBytes, sc.MaxMsgSize, sc.MaxAge)
		}
		if sc.Discard != jetstream.DiscardNew {
			t.Errorf("stream %s drops stored messages at its limits", sc.Name)
		}
	}
	bad := events.DefaultStreamConfig()
	bad.MaxConsumers = -1
	if err := bad.Check(); err == nil {
		t.Error("a max consumers the server would replace by its default is accepted")
	}
}

// Creating what is missing leaves an operator's limits alone; the
// operator's EnsureStreams applies them.
func TestCreateMissingStreamsKeepsOperatorLimits(t *testing.T) {
	js := startJS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	op := events.DefaultStreamConfig()
	op.MaxBytes = 5 << 20
	if err := events.EnsureStreams(ctx, js, op); err != nil {
		t.Fatal(err)
	}
	if err := events.CreateMissingStreams(ctx, js, events.DefaultStreamConfig()); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.MaxBytes; got != 5<<20 {
		t.Fatalf("max bytes %d after CreateMissingStreams, want the operator's %d", got, 5<<20)
	}
}

// A full stream refuses the next event with an error naming the limit and
// the setting; what is stored stays.
func TestFullStreamRefusesWithTheLimitNamed(t *testing.T) {
	js := startJS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := events.DefaultStreamConfig()
	cfg.MaxBytes = 4096
	if err := events.EnsureStreams(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	var err error
	stored := 0
	for range 100 {
		if _, err = js.Publish(ctx, events.EventsPrefix+".release.published", make([]byte, 500)); err != nil {
			break
		}
		stored++
	}
	if err == nil {
		t.Fatal("100 events of 500 bytes fit in 4096 bytes")
	}
	s, _ := js.Stream(ctx, events.StreamEvents)
	info, _ := s.Info(ctx)
	le := events.AsLimitError(events.StreamEvents, err, info)
	if le == nil {
		t.Fatalf("refusal %v is not read as a limit", err)
	}
	if info.State.Msgs != uint64(stored) {
		t.Errorf("stream holds %d messages, %d were stored: a full stream dropped some", info.State.Msgs, stored)
	}
	for _, want := range []string{"STEWARD_EVENTS", "max_bytes of 4096", "--max-bytes", "STEWARD_MAX_BYTES", "nothing stored was dropped"} {
		if !strings.Contains(le.Error(), want) {
			t.Errorf("%q does not say %q", le, want)
		}
	}
	if !errors.Is(le, err) {
		t.Error("the LimitError does not wrap JetStream's refusal")
	}
}

// The stored notices are what StreamConfig.Notices says: every event's by
// default, one filter's, or none; a filter they cannot be sent for is
// refused, naming the notices and what is taken.
func TestStoredNoticesFollowTheConfig(t *testing.T) {
	for notices, want := range map[string]*jetstream.RePublish{
		events.DefaultNotices:               {Source: "steward.events.>", Destination: "steward.stored.>", HeadersOnly: true},
		"steward.events.invitation.>":       {Source: "steward.events.invitation.>", Destination: "steward.stored.invitation.>", HeadersOnly: true},
		"steward.events.grant.changed.db-1": {Source: "steward.events.grant.changed.db-1", Destination: "steward.stored.grant.changed.db-1", HeadersOnly: true},
		"":                                  nil,
	} {
		c := events.DefaultStreamConfig()
		c.Notices = notices
		if err := c.Check(); err != nil {
			t.Fatalf("stored notices %q refused: %v", notices, err)
		}
		got := c.StreamConfigs()[0].RePublish
		if (got == nil) != (want == nil) || (got != nil && *got != *want) {
			t.Errorf("stored notices %q give RePublish %+v, want %+v", notices, got, want)
		}
	}
	if got := events.DefaultStreamConfig().Notices; got != events.DefaultNotices {
		t.Errorf("default stored notices %q, want every event's (%s)", got, events.DefaultNotices)
	}
	for _, bad := range []string{"steward.outcomes.>", "steward.events", "steward.events.", ">", "steward.events.*.rotated.>",
		"steward.events.>.x", "steward.events..x", "steward.events.a b", "steward.events.x>"} {
		c := events.DefaultStreamConfig()
		c.Notices = bad
		err := c.Check()
		if err == nil || !strings.Contains(err.Error(), "stored notices") || !strings.Contains(err.Error(), "none") {
			t.Errorf("stored notices %q: %v; want a refusal naming the stored notices and what is taken", bad, err)
		}
	}
}

// NoticesCover is a subset match (FilterCovers) with empty meaning every
// subject: every subject the instance's filter matches must be one the
// notices are sent for, and a literal subject matches as NATS matches it.
func TestNoticesCover(t *testing.T) {
	for _, c := range []struct {
		source, subject string
		want            bool
	}{
		{"", "steward.events.credential.rotated.hive-1", true},
		{"steward.events.>", "steward.events.credential.rotated.hive-1", true},
		{"steward.events.>", "steward.events.credential.>", true},
		{"steward.events.>", "steward.events.*.rotated.hive-1", true},
		{"steward.events.credential.>", "steward.events.credential.rotated.hive-1", true},
		{"steward.events.credential.>", "steward.events.credential", false},
		{"steward.events.credential.>", "steward.events.*.rotated.hive-1", false},
		{"steward.events.credential.>", "steward.events.>", false},
		{"steward.events.invitation.>", "steward.events.credential.rotated.hive-1", false},
		{"steward.events.*.rotated.*", "steward.events.credential.rotated.hive-1", true},
		{"steward.events.*.rotated.*", "steward.events.credential.rotated.>", false},
		{"steward.events.*.rotated.*", "steward.events.credential.rotated.*", true},
		{"steward.events.credential.rotated.hive-1", "steward.events.credential.rotated.hive-1", true},
		{"steward.events.credential.rotated.hive-1", "steward.events.credential.rotated.hive-2", false},
		{"steward.events.credential.rotated.hive-1", "steward.events.credential.rotated.*", false},
		{"steward.events.credential.rotated", "steward.events.credential.rotated.hive-1", false},
		// Literal subjects, as a key-value bucket's keys are matched.
		{"a.b", "a.b", true},
		{"a.b", "a.c", false},
		{"a.*", "a.b", true},
		{"a.*", "a.b.c", false},
		{"a.>", "a.b.c", true},
		{"a.>", "a", false},
		{"*.b", "a.b", true},
		{"a.b.c", "a.b", false},
	} {
		if got := events.NoticesCover(c.source, c.subject); got != c.want {
			t.Errorf("NoticesCover(%q, %q) = %v, want %v", c.source, c.subject, got, c.want)
		}
	}
}
