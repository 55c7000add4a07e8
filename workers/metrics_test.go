package workers_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// metric reads one of an instance's gauges or counters from reg, summed
// over the series that carry every label of labels (name, value, ...).
func metric(t testing.TB, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	if len(labels)%2 != 0 {
		t.Fatalf("metric %s: labels %q are not name and value pairs", name, labels)
	}
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
			if !hasLabels(m.GetLabel(), labels) {
				continue
			}
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

// hasLabels reports whether have carries each name and value of want.
func hasLabels(have []*dto.LabelPair, want []string) bool {
	for i := 0; i+1 < len(want); i += 2 {
		if !slices.ContainsFunc(have, func(l *dto.LabelPair) bool { return l.GetName() == want[i] && l.GetValue() == want[i+1] }) {
			return false
		}
	}
	return true
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
	}), workers.WithAckWait(ackWait), workers.WithRegisterer(reg), workertest.StatusEvery(10*time.Millisecond), cappedBackoff(50*time.Millisecond))
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

// TestRefusalsAreCountedByTheirRule: an operator alerts on a rule (a
// downgrade, a bad signature), never on a reason's text, and no event can
// make a label of its own.
func TestRefusalsAreCountedByTheirRule(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	reg := prometheus.NewRegistry()
	r := workertest.Start(t, js, spec("rules"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		rule := map[uint64]string{1: "downgrade", 2: "downgrade", 3: "a rule of free text, 1.2.3 > 1.2.0"}[versionOf(t, d)]
		if err := d.Emit(ctx, "refused", map[string]string{"rule": rule, "reason": "release 1.1.0 is older than the installed 1.2.0"}); err != nil {
			return err
		}
		return workers.Refused(errors.New(rule))
	}), workers.WithRegisterer(reg))
	for v := uint64(1); v <= 3; v++ {
		publishRotation(t, js, fmt.Sprintf("hive-r%d", v), v)
	}
	workertest.WaitIdle(t, js, r.ConsumerName())
	workertest.WaitUntil(t, "three refusals are counted", func() bool {
		return metric(t, reg, "steward_refusals_total") == 3
	})
	if n := metric(t, reg, "steward_refusals_total", "rule", "downgrade", "outcome", "refused", "instance", "rules"); n != 2 {
		t.Fatalf("refusals by rule downgrade: %v, want 2", n)
	}
	if n := metric(t, reg, "steward_refusals_total", "rule", "unnamed"); n != 1 {
		t.Fatalf("a rule that is no name is counted as unnamed: %v, want 1", n)
	}
}
