package publisher_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers/workertest"
)

// TestAFullStreamRefusesWithTheLimitNamedAndCounted fills a stream set up
// with a small byte limit: the publisher's error names the limit and the
// setting that raises it, the refusal is counted, and nothing stored is
// dropped.
func TestAFullStreamRefusesWithTheLimitNamedAndCounted(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	ctx := context.Background()
	cfg := events.DefaultStreamConfig()
	cfg.MaxBytes = 4096
	if err := events.EnsureStreams(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	p := publisher.New(js, publisher.WithRegisterer(reg))
	stored := 0
	var refused error
	for i := 0; i < 200 && refused == nil; i++ {
		e, err := events.New(events.TypeReleasePublished, "1.0.0", events.ReleasePublished{Version: "1.0.0"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Publish(ctx, e); err != nil {
			refused = err
			break
		}
		stored++
	}
	var le *events.LimitError
	if !errors.As(refused, &le) || le.Limit != "max_bytes" {
		t.Fatalf("after %d events the publisher said %v; want a LimitError on max_bytes", stored, refused)
	}
	if !strings.Contains(refused.Error(), "--max-bytes") {
		t.Errorf("the refusal does not name the setting that raises the limit: %v", refused)
	}
	if got := testutil.ToFloat64(p.RefusedCounter().WithLabelValues(events.StreamEvents, "max_bytes")); got != 1 {
		t.Errorf("steward_publish_refused_total = %v, want 1", got)
	}
	s, err := js.Stream(ctx, events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if info, _ := s.Info(ctx); int(info.State.Msgs) != stored {
		t.Errorf("the stream holds %d events, %d were stored: a full stream dropped some", info.State.Msgs, stored)
	}
}
