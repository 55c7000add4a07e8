package bench

import (
	"context"
	"testing"
	"time"
)

// TestRunMeasuresBothPaths proves a small run handles every event on both
// paths and reports sane figures: positive rates, p50 <= p99, elapsed time
// covering the latencies.
func TestRunMeasuresBothPaths(t *testing.T) {
	res, err := Run(context.Background(), Options{Events: 300, Keys: 8, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for name, m := range map[string]Measure{"runtime": res.Runtime, "raw": res.Raw} {
		if m.Events != 300 || m.PerSecond <= 0 || m.P50 <= 0 || m.P50 > m.P99 || m.P99 > m.Elapsed {
			t.Fatalf("%s: %+v", name, m)
		}
	}
	if res.Ratio() <= 0 {
		t.Fatalf("ratio %v", res.Ratio())
	}
	t.Log("\n" + res.String())
}

// TestEnvRunsAgain proves successive runs on one server each see only
// their own events (the benchmark harness calls it repeatedly).
func TestEnvRunsAgain(t *testing.T) {
	env, err := Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	for _, n := range []int{50, 120} {
		m, err := env.Runtime(context.Background(), Options{Events: n, Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if m.Events != n {
			t.Fatalf("runtime measured %d events, want %d", m.Events, n)
		}
		if m, err = env.Raw(context.Background(), Options{Events: n, Timeout: time.Minute}); err != nil || m.Events != n {
			t.Fatalf("raw: %+v, %v", m, err)
		}
	}
}

// BenchmarkPipeline publishes b.N events through a no-op worker run by the
// runtime and the same number through a plain pull consumer with explicit
// acks, and reports both rates, the runtime's latencies and the ratio.
// Run it with a fixed count: go test -bench Pipeline -benchtime 10000x ./internal/bench
func BenchmarkPipeline(b *testing.B) {
	env, err := Start(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	defer env.Close()
	b.ResetTimer()
	rt, err := env.Runtime(context.Background(), Options{Events: b.N})
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	raw, err := env.Raw(context.Background(), Options{Events: b.N})
	if err != nil {
		b.Fatal(err)
	}
	res := Result{Runtime: rt, Raw: raw}
	b.ReportMetric(rt.PerSecond, "events/s")
	b.ReportMetric(float64(rt.P50.Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(rt.P99.Microseconds())/1000, "p99-ms")
	b.ReportMetric(raw.PerSecond, "raw-events/s")
	b.ReportMetric(float64(raw.P50.Microseconds())/1000, "raw-p50-ms")
	b.ReportMetric(float64(raw.P99.Microseconds())/1000, "raw-p99-ms")
	b.ReportMetric(res.Ratio(), "ratio")
}
