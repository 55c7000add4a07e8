package bench

import (
	"context"
	"strings"
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
	for name, m := range map[string]Measure{"runtime": res.Runtime, "raw Ack": res.RawAck, "raw DoubleAck": res.RawDouble} {
		if m.Events != 300 || m.PerSecond <= 0 || m.Handler.P50 <= 0 || m.Handler.P50 > m.Handler.P99 ||
			m.Settled.P50 < m.Handler.P50 || m.Settled.P99 < m.Handler.P99 || m.Settled.P99 > m.Elapsed {
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
		if m, err = env.Raw(context.Background(), Options{Events: n, Timeout: time.Minute}, true); err != nil || m.Events != n {
			t.Fatalf("raw: %+v, %v", m, err)
		}
	}
}

// TestRunAtASteadyRate proves the paced mode publishes at about the rate
// asked: 200 events at 400/s take at least half a second.
func TestRunAtASteadyRate(t *testing.T) {
	res, err := Run(context.Background(), Options{Events: 200, Keys: 8, Rate: 400, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if res.Runtime.Elapsed < 450*time.Millisecond || res.RawDouble.Elapsed < 450*time.Millisecond {
		t.Fatalf("200 events at 400/s took %v and %v; the rate was not kept", res.Runtime.Elapsed, res.RawDouble.Elapsed)
	}
	if !strings.Contains(res.String(), "400 events/s") {
		t.Fatalf("the report does not say the rate:\n%s", res)
	}
}

// BenchmarkPipeline publishes b.N events through a no-op worker run by the
// runtime and the same number through the raw Ack and serial DoubleAck
// consumers, and reports the rates, the p99 latencies and the ratios.
// Run it with a fixed count: go test -bench Pipeline -benchtime 20000x ./internal/bench
func BenchmarkPipeline(b *testing.B) {
	res, err := Run(context.Background(), Options{Events: b.N})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(res.Runtime.PerSecond, "events/s")
	b.ReportMetric(res.RawAck.PerSecond, "raw-ack-events/s")
	b.ReportMetric(res.RawDouble.PerSecond, "raw-double-events/s")
	b.ReportMetric(float64(res.Runtime.Settled.P99.Microseconds())/1000, "settled-p99-ms")
	b.ReportMetric(res.Ratio(), "ratio")
}

// BenchmarkSteady is BenchmarkPipeline at 1,000 events per second: the
// latencies, not the rate, are what it measures.
func BenchmarkSteady(b *testing.B) {
	res, err := Run(context.Background(), Options{Events: b.N, Rate: 1000})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(res.Runtime.Settled.P99.Microseconds())/1000, "settled-p99-ms")
	b.ReportMetric(float64(res.RawDouble.Settled.P99.Microseconds())/1000, "raw-double-settled-p99-ms")
	b.ReportMetric(res.SettledRatio(), "settled-ratio")
	b.ReportMetric(res.HandlerRatio(), "handler-ratio")
}
