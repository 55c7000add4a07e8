package workers_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// metric reads one of an instance's gauges or counters from reg.
func metric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			switch {
			case m.GetGauge() != nil:
				v += m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				v += m.GetCounter().GetValue()
			}
		}
	}
	return v
}

// TestMetricsSayWhatAnOperatorAlertsOn: the age of the oldest unsettled
// event while a handler holds one, the keys retrying, and redeliveries
// after a process died holding an event, all from what the runtime already
// knows (no consumer info).
func TestMetricsSayWhatAnOperatorAlertsOn(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	const ackWait = 300 * time.Millisecond
	dieHolding(t, srv, spec("metrics"), ackWait, func() { publishRotation(t, js, "hive-m", 1) })

	reg := prometheus.NewRegistry()
	release := make(chan struct{})
	dep := &dependency{down: true}
	r := workertest.Start(t, js, spec("metrics"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		switch versionOf(t, d) {
		case 1:
			<-release
		case 2:
			return dep.call()
		}
		return nil
	}), workers.WithAckWait(ackWait), workers.WithRegisterer(reg), workers.WithStatusInterval(10*time.Millisecond), cappedBackoff(50*time.Millisecond))
	publishRotation(t, js, "hive-n", 2)

	workertest.WaitUntil(t, "the held event's age and the retrying key are measured", func() bool {
		return metric(t, reg, "steward_events_oldest_unsettled_seconds") > 0 && metric(t, reg, "steward_keys_retrying") == 1
	})
	workertest.WaitUntil(t, "the redelivery of the dead process's event is counted", func() bool {
		return metric(t, reg, "steward_events_redelivered_total") >= 1
	})
	close(release)
	dep.set(false)
	workertest.WaitIdle(t, js, r.ConsumerName())
	workertest.WaitUntil(t, "nothing is held or retrying any more", func() bool {
		return metric(t, reg, "steward_events_oldest_unsettled_seconds") == 0 && metric(t, reg, "steward_keys_retrying") == 0
	})
}
