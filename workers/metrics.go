package workers

import (
	"encoding/json"
	"errors"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/steward-dev/steward/events"
)

// The results a delivery is counted under in steward_events_total.
const (
	resultApplied = "applied"
	resultSkipped = "skipped"
	resultRefused = "refused"
	// resultSuperseded: a newer verified event of its key was queued
	// behind it under a latest-wins Spec, so it was settled unapplied.
	resultSuperseded = "superseded"
	resultRetried    = "retried"
	resultDead       = "dead_lettered"
	resultReleased   = "released" // naked at shutdown, redelivered at once
	// resultDeferred is logged, not counted: the event waits, still held,
	// behind an earlier event of its key.
	resultDeferred = "deferred"
)

type metrics struct {
	events      *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	inFlight    *prometheus.GaugeVec
	panics      *prometheus.CounterVec
	retrying    *prometheus.GaugeVec
	waiting     *prometheus.GaugeVec
	oldestRetry *prometheus.GaugeVec
	pending     *prometheus.GaugeVec
	redelivered *prometheus.CounterVec
	oldestHeld  *prometheus.GaugeVec
	dlqFailed   *prometheus.CounterVec
	forged      *prometheus.CounterVec
	refusals    *prometheus.CounterVec
}

// instanceMetrics are one worker instance's children of the vectors,
// looked up once: a label lookup per event is measurable at fleet rates.
type instanceMetrics struct {
	results     map[string]prometheus.Counter
	duration    prometheus.Observer
	inFlight    prometheus.Gauge
	panics      prometheus.Counter
	retrying    prometheus.Gauge
	waiting     prometheus.Gauge
	oldestRetry prometheus.Gauge
	pending     prometheus.Gauge
	redelivered prometheus.Counter
	oldestHeld  prometheus.Gauge
	dlqFailed   prometheus.Counter
	forged      map[events.DocKind]prometheus.Counter
	// refusals is the vector itself: refusals are rare, and their rules
	// are known only when one is emitted.
	refusals         *prometheus.CounterVec
	worker, instance string
}

func (m *metrics) forInstance(worker, instance string) *instanceMetrics {
	l := prometheus.Labels{"worker": worker, "instance": instance}
	im := &instanceMetrics{
		results:     map[string]prometheus.Counter{},
		duration:    m.duration.With(l),
		inFlight:    m.inFlight.With(l),
		panics:      m.panics.With(l),
		retrying:    m.retrying.With(l),
		waiting:     m.waiting.With(l),
		oldestRetry: m.oldestRetry.With(l),
		pending:     m.pending.With(l),
		redelivered: m.redelivered.With(l),
		oldestHeld:  m.oldestHeld.With(l),
		dlqFailed:   m.dlqFailed.With(l),
		forged:      map[events.DocKind]prometheus.Counter{},
		refusals:    m.refusals,
		worker:      worker, instance: instance,
	}
	for _, k := range events.DocKinds {
		im.forged[k] = m.forged.With(prometheus.Labels{"worker": worker, "instance": instance, "kind": string(k)})
	}
	for _, r := range []string{resultApplied, resultRefused, resultSuperseded, resultSkipped, resultRetried, resultDead, resultReleased} {
		im.results[r] = m.events.With(prometheus.Labels{"worker": worker, "instance": instance, "result": r})
	}
	return im
}

// emitted counts an outcome of type typ that is a refusal (refused, or a
// worker's own kind such as join's floor-refused) under the rule its data
// names: a short name from the worker's code, never the reason's text. A
// rule that is not such a name is counted as "unnamed", so no event can
// grow the metric's labels.
func (im *instanceMetrics) emitted(noun, typ string, data []byte) {
	outcome := strings.TrimSuffix(strings.TrimPrefix(typ, "dev.steward."+noun+"."), ".v1")
	if outcome != "refused" && !strings.HasSuffix(outcome, "-refused") {
		return
	}
	var named struct {
		Rule string `json:"rule"`
	}
	rule := "unnamed"
	if json.Unmarshal(data, &named) == nil && events.CheckKey(named.Rule) == nil && len(named.Rule) <= 32 {
		rule = named.Rule
	}
	im.refusals.With(prometheus.Labels{"worker": im.worker, "instance": im.instance, "outcome": outcome, "rule": rule}).Inc()
}

// count counts one delivery under its result.
func (im *instanceMetrics) count(result string) {
	if c, ok := im.results[result]; ok {
		c.Inc()
	}
}

// register returns c, or the collector already registered under its name:
// several workers in one process (steward dev) share the vectors.
func register[C prometheus.Collector](r prometheus.Registerer, c C) C {
	if err := r.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
	}
	return c
}

func newMetrics(r prometheus.Registerer) *metrics {
	labels := []string{"worker", "instance"}
	return &metrics{
		events: register(r, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "steward_events_total",
			Help: "Deliveries handled, by result: applied, refused, superseded, skipped (stale), retried, dead_lettered, released.",
		}, append(labels, "result"))),
		duration: register(r, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "steward_handler_duration_seconds",
			Help:    "Time spent in the worker's handler per delivery.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, labels)),
		inFlight: register(r, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "steward_events_in_flight",
			Help: "Events held by the worker: queued behind their key or being handled.",
		}, labels)),
		panics: register(r, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "steward_handler_panics_total",
			Help: "Handler panics caught and counted as failures.",
		}, labels)),
		retrying: register(r, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "steward_keys_retrying",
			Help: "Keys whose event failed and is being retried.",
		}, labels)),
		waiting: register(r, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "steward_keys_waiting",
			Help: "Keys whose next event waits for an earlier one held elsewhere.",
		}, labels)),
		oldestRetry: register(r, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "steward_retry_oldest_seconds",
			Help: "Age of the oldest first failure among the keys being retried.",
		}, labels)),
		pending: register(r, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "steward_events_pending",
			Help: "Events stored for the instance and not delivered yet, as the last delivery said (its NumPending); 0 for a stream reader.",
		}, labels)),
		redelivered: register(r, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "steward_events_redelivered_total",
			Help: "Deliveries that were redeliveries (a process died holding them, or they were handed back).",
		}, labels)),
		oldestHeld: register(r, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "steward_events_oldest_unsettled_seconds",
			Help: "Age of the oldest event the instance holds and has not settled (queued, waiting, retrying or running).",
		}, labels)),
		dlqFailed: register(r, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "steward_dlq_writes_failed_total",
			Help: "Dead letters that could not be written; each event was kept and tried again.",
		}, labels)),
		forged: register(r, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "steward_forged_documents_total",
			Help: "Documents of the instance's in the checkpoint bucket that did not verify for their writer, by kind; each was not believed and fell back (docs/design.md §7).",
		}, append(labels, "kind"))),
		refusals: register(r, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "steward_refusals_total",
			Help: "Refusals the worker's rules made (outcomes refused, or a worker's own such as floor-refused), by the rule the outcome names; the reason is in the outcome and in steward history.",
		}, append(labels, "outcome", "rule"))),
	}
}
