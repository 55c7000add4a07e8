package workers_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/replay"
	"github.com/steward-dev/steward/workers/workertest"
)

func TestLogsCarryTheFieldsAndMetricsAndHealthAreServed(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	var logs workertest.Logs
	reg := prometheus.NewRegistry()
	r := workertest.Start(t, js, spec("observe"), workers.HandlerFunc(func(context.Context, *workers.Delivery) error { return nil }),
		workers.WithLogger(zerolog.New(&logs)), workers.WithRegisterer(reg))
	ack := publishRotation(t, js, "hive-log", 7)
	workertest.WaitIdle(t, js, r.ConsumerName())

	var line map[string]any
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, `"delivery handled"`) {
			if err := json.Unmarshal([]byte(l), &line); err != nil {
				t.Fatal(err)
			}
		}
	}
	if strings.Contains(logs.String(), "not-a-real-secret") {
		t.Error("event data reached the logs")
	}
	for field, want := range map[string]any{"worker": testWorker, "instance": "observe", "key": "hive-log", "event_id": ack.ID,
		"type": events.TypeCredentialRotated, "seq": float64(ack.Sequence), "attempt": float64(1), "outcome": "applied"} {
		if line[field] != want {
			t.Errorf("log field %s = %v, want %v", field, line[field], want)
		}
	}
	if _, ok := line["duration"]; !ok {
		t.Error("no duration in the log line")
	}

	hs := httptest.NewServer(ops.NewServeMux(reg, r.Ready))
	defer hs.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz %d", code)
	}
	if code, _ := get("/readyz"); code != 200 {
		t.Fatalf("/readyz %d while running", code)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, `steward_events_total{instance="observe",result="applied",worker="rt"} 1`) {
		t.Fatalf("/metrics %d:\n%s", code, body)
	}
	r.Stop()
	if code, _ := get("/readyz"); code != 503 {
		t.Fatalf("/readyz %d after stop, want 503", code)
	}
}

func TestRecordedStreamReplaysFromJSONL(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	rec := newRecorder()
	r := workertest.Start(t, js, spec("jsonl"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		rec.record(d.Key, versionOf(t, d))
		return nil
	}))
	acks := workertest.PublishFile(t, js, "testdata/rotations.jsonl")
	workertest.WaitIdle(t, js, r.ConsumerName())
	if len(acks) != 3 || !acks[2].Duplicate {
		t.Fatalf("acks %+v: want 3, the last a duplicate of the first", acks)
	}
	if got := strings.Join(rec.order, " "); got != "hive-j:1 hive-j:2" {
		t.Fatalf("handled %q", got)
	}

	// Replaying the stream through the handler again, outside the consumer.
	var results []replay.Result
	if err := r.Replayer(t).Replay(context.Background(), replay.From{}, true, nil, func(res replay.Result) { results = append(results, res) }); err != nil {
		t.Fatal(err)
	}
	if len(results) != 2 || results[0].Err != nil || results[0].Key != "hive-j" {
		t.Fatalf("dry run: %+v", results)
	}
	if err := r.Replayer(t).Replay(context.Background(), replay.From{Sequence: 2}, false, nil, func(replay.Result) {}); err != nil {
		t.Fatal(err)
	}
	if rec.count(2) != 2 || rec.count(1) != 1 {
		t.Fatalf("replay from sequence 2 handled v1 %d and v2 %d times; want 1 and 2", rec.count(1), rec.count(2))
	}
}
