package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/internal/bench"
)

// TestWatermillPath runs the Watermill path as `steward bench` does, on an
// embedded server: every event is handled and its confirmed ack seen, the
// report line says so, and the subscriber's consumer is gone afterwards.
func TestWatermillPath(t *testing.T) {
	env, err := bench.Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	var stdout, stderr bytes.Buffer
	code := bench.ExternalMain(context.Background(), []string{"--url", env.URL(), "--events", "300", "--keys", "8", "--warm-up", "50", "--timeout", "1m"},
		&stdout, &stderr, "watermill", consume)
	if code != 0 || !strings.HasPrefix(stdout.String(), "watermill ") || !strings.Contains(stdout.String(), "300 events in") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
	t.Log(stdout.String())
	nc, err := nats.Connect(env.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	streams := js.ListStreams(context.Background())
	for info := range streams.Info() {
		s, err := js.Stream(context.Background(), info.Config.Name)
		if err != nil {
			t.Fatal(err)
		}
		names := s.ConsumerNames(context.Background())
		for name := range names.Name() {
			t.Errorf("consumer %s is left on %s", name, info.Config.Name)
		}
	}
	if err := streams.Err(); err != nil {
		t.Fatal(err)
	}
}
