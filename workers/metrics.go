package workers

import (
	"errors"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The results a delivery is counted under in steward_events_total.
const (
	resultApplied  = "applied"
	resultSkipped  = "skipped"
	resultRefused  = "refused"
	resultRetried  = "retried"
	resultDead     = "dead_lettered"
	resultReleased = "released" // naked at shutdown, redelivered at once
	// resultDeferred is logged, not counted: the event waits, still held,
	// behind an earlier event of its key.
	resultDeferred = "deferred"
)

type metrics struct {
	events   *prometheus.CounterVec
	duration *prometheus.HistogramVec
	inFlight *prometheus.GaugeVec
	panics   *prometheus.CounterVec
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
			Help: "Deliveries handled, by result: applied, refused, skipped (stale), retried, dead_lettered, released.",
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
	}
}

// NewServeMux serves Prometheus metrics from g on /metrics, liveness on
// /healthz and readiness on /readyz: ready reports why the process cannot
// do its work yet (nil when it can).
func NewServeMux(g prometheus.Gatherer, ready func() error) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	return mux
}
