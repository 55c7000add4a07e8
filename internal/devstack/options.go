package devstack

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/workers"
)

// Option configures a Stack.
type Option func(*options)

type options struct {
	natsListen, httpListen string
	databaseURL, pgBin     string
	traceURL               string
	replicas               int
	log                    zerolog.Logger
	workers                []Worker
	workerOptions          func(prometheus.Registerer) []workers.Option
	registry               *prometheus.Registry
}

func defaultOptions() options {
	return options{
		natsListen: "127.0.0.1:4223",
		httpListen: "127.0.0.1:8080",
		replicas:   1,
		log:        zerolog.Nop(),
		registry:   prometheus.NewRegistry(),
	}
}

// WithNATSListen is the embedded NATS server's address (default
// 127.0.0.1:4223; 4222 is refused, port 0 picks one).
func WithNATSListen(addr string) Option { return func(o *options) { o.natsListen = addr } }

// WithHTTPListen is the address of the ingress, the console, /metrics,
// /healthz and /readyz (default 127.0.0.1:8080; port 0 picks one).
func WithHTTPListen(addr string) Option { return func(o *options) { o.httpListen = addr } }

// WithDatabaseURL is a PostgreSQL server (a superuser's connection string)
// for the provision worker instead of the stack's private cluster; the
// stack then starts none.
func WithDatabaseURL(url string) Option { return func(o *options) { o.databaseURL = url } }

// WithPGBin is the folder of PostgreSQL's server binaries for the private
// cluster (default: pg_config --bindir, else the newest
// /usr/lib/postgresql/*/bin).
func WithPGBin(dir string) Option { return func(o *options) { o.pgBin = dir } }

// WithTraceURL links the console's trace ids to a trace UI (a template
// with {traceId}; "" shows them as text).
func WithTraceURL(template string) Option { return func(o *options) { o.traceURL = template } }

// WithReplicas is the streams' and the bucket's replicas (default 1).
func WithReplicas(n int) Option { return func(o *options) { o.replicas = n } }

// WithLogger receives the stack's warnings and the ingress's, the
// console's and the workers' lines (default: discarded).
func WithLogger(log zerolog.Logger) Option { return func(o *options) { o.log = log } }

// WithWorkers are the workers the stack runs, one development instance
// each, in order.
func WithWorkers(w ...Worker) Option { return func(o *options) { o.workers = append(o.workers, w...) } }

// WithWorkerOptions are the runtime options every worker runs with, given
// the registry its metrics go to (the command's runtime flags); the stack
// adds each instance's document keys.
func WithWorkerOptions(f func(prometheus.Registerer) []workers.Option) Option {
	return func(o *options) { o.workerOptions = f }
}

// WithRegistry is the registry /metrics serves and the workers and the
// ingress register with (default: an empty one).
func WithRegistry(reg *prometheus.Registry) Option { return func(o *options) { o.registry = reg } }
