package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/proof"
	"github.com/steward-dev/steward/workers/workertest"
)

// steward setup sets STEWARD_EVENTS's stored notices as --stored-notices
// says, says what it set, and refuses a filter they cannot be sent for
// without touching the stream.
func TestSetupSetsTheStoredNotices(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	// setup records the upgrade in the bucket as the operator, so it
	// signs with the operator's document key.
	key := filepath.Join(t.TempDir(), "operator.key")
	if _, err := proof.GenerateKey(key); err != nil {
		t.Fatal(err)
	}
	setup := func(args ...string) (string, error) {
		out, _, err := opsRunAs(t, &globals{natsURL: srv.URL(), replicas: 1, log: zerolog.Nop(), documentKey: key}, newSetupCmd, args...)
		return out, err
	}
	republish := func() string {
		t.Helper()
		s, err := js.Stream(context.Background(), events.StreamEvents)
		if err != nil {
			t.Fatal(err)
		}
		if rp := s.CachedInfo().Config.RePublish; rp != nil {
			return rp.Source + " -> " + rp.Destination
		}
		return "none"
	}
	for _, tc := range []struct {
		args            []string
		said, republish string
	}{
		{nil, "stored notices of STEWARD_EVENTS: steward.events.> on steward.stored.>", "steward.events.> -> steward.stored.>"},
		{[]string{"--stored-notices", "none"}, "stored notices of STEWARD_EVENTS: none", "none"},
		{[]string{"--stored-notices", "steward.events.invitation.>"}, "stored notices of STEWARD_EVENTS: steward.events.invitation.> on steward.stored.invitation.>", "steward.events.invitation.> -> steward.stored.invitation.>"},
	} {
		out, err := setup(tc.args...)
		if err != nil {
			t.Fatalf("steward setup %v: %v", tc.args, err)
		}
		if !strings.Contains(out, tc.said) {
			t.Errorf("steward setup %v said:\n%s\nwant a line %q", tc.args, out, tc.said)
		}
		if got := republish(); got != tc.republish {
			t.Errorf("after steward setup %v the stream republishes %s, want %s", tc.args, got, tc.republish)
		}
	}
	_, err := setup("--stored-notices", "steward.outcomes.>")
	if err == nil || !strings.Contains(err.Error(), `stored notices "steward.outcomes.>"`) || !strings.Contains(err.Error(), "none") {
		t.Fatalf("steward setup --stored-notices steward.outcomes.>: %v; want a refusal naming the notices and what is taken", err)
	}
	// An empty value (an environment twin left empty) is not none.
	if _, err := setup("--stored-notices", ""); err == nil || !strings.Contains(err.Error(), "--stored-notices is empty") {
		t.Fatalf("steward setup --stored-notices '': %v; want a refusal saying it is empty", err)
	}
	if got := republish(); got != "steward.events.invitation.> -> steward.stored.invitation.>" {
		t.Fatalf("a refused setup changed the stored notices to %s", got)
	}
}
