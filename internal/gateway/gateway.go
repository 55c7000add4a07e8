// Package gateway is the HTTP side that `steward serve` and `steward dev`
// run: the ingress (publisher.Ingress) with its signing gate and scoped
// tokens (internal/tokens) on /events, the web console (internal/console)
// on /, and metrics and health beside them. Both commands build it from the
// same Config, so the ingress and the console decide alike for every
// caller: one token check, one gate.
package gateway

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/console"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/internal/proof"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/internal/tokens"
	"github.com/steward-dev/steward/publisher"
)

// Config is who the gateway accepts, what it may sign, and the connections
// it works through.
type Config struct {
	// Token is the one unscoped token (--token-file): it publishes only
	// types the controller never signs (tokens.UnsignedTypes). TokensDir
	// holds the scoped tokens' documents (--tokens-dir), read again on
	// every request and believed as Verifier believes them. Token or
	// TokensDir is required.
	Token     string
	TokensDir string
	Verifier  *proof.Verifier
	// MaxBody is the largest request body the ingress accepts (default
	// publisher.DefaultMaxBody).
	MaxBody int64
	// Signer is the controller key (--signing-key); nil signs nothing.
	// Controller verifies the newest event stored on a key (default: the
	// Signer's public key).
	Signer     *signing.EventSigner
	Controller *signing.KeySet
	// NC and JS are the ingress's connection (a publisher's): it
	// publishes, reads the newest event of a key and writes the audit
	// events, signed with Audit (nil: unsigned), in the JetStream Domain.
	NC     *nats.Conn
	JS     jetstream.JetStream
	Audit  *proof.Signer
	Domain string
	// ConsoleJS is the console's connection: it reads status, history and
	// dead letters, pauses instances and retries letters, so it must be
	// an operator's. ConsoleDocs is the checkpoint bucket as that
	// identity; nil shows documents unverified. Required.
	ConsoleJS   jetstream.JetStream
	ConsoleDocs *events.Store
	// Registry is where the ingress's metrics are registered and what
	// /metrics serves; Ready answers /readyz.
	Registry *prometheus.Registry
	Ready    func() error
	// TraceURL links the console's trace ids to a trace UI
	// (--trace-url, e.g. https://jaeger.example/trace/{traceId}); ""
	// shows them as text.
	TraceURL string
	// Log receives the ingress's, the gate's and the console's lines.
	Log zerolog.Logger
}

// CheckTraceURL checks --trace-url (STEWARD_TRACE_URL) before anything
// is started, so a bad template is refused naming the flag.
func CheckTraceURL(template string) error {
	if template == "" {
		return nil
	}
	if err := console.CheckTraceURL(template); err != nil {
		return fmt.Errorf("--trace-url (STEWARD_TRACE_URL): %w", err)
	}
	return nil
}

// Gateway is the mux of the ingress, the console, metrics and health.
type Gateway struct {
	mux *http.ServeMux
}

// New builds the gateway of cfg.
func New(cfg Config) (*Gateway, error) {
	if cfg.JS == nil || cfg.ConsoleJS == nil || cfg.Registry == nil {
		return nil, errors.New("the gateway needs the ingress's connection, the console's connection and a metrics registry")
	}
	if err := CheckTraceURL(cfg.TraceURL); err != nil {
		return nil, err
	}
	if cfg.Signer != nil && cfg.Controller == nil {
		var err error
		if cfg.Controller, err = signing.NewKeySet(cfg.Signer.Public()); err != nil {
			return nil, fmt.Errorf("--controller-key: %w", err)
		}
	}
	gate, scoped, err := newGate(cfg)
	if err != nil {
		return nil, err
	}
	var checked publisher.Tokens
	if scoped != nil {
		checked = scoped
	}
	ingressLog := cfg.Log.With().Str("component", "ingress").Logger()
	in, err := publisher.NewIngress(publisher.New(cfg.JS, publisher.WithRegisterer(cfg.Registry)),
		publisher.IngressConfig{Token: cfg.Token, Tokens: checked, Sign: gate.Hook(), MaxBody: cfg.MaxBody, Log: ingressLog})
	if err != nil {
		return nil, err
	}
	mux := ops.NewServeMux(cfg.Registry, cfg.Ready)
	mux.Handle(publisher.IngressPath, in)
	// What a console login may publish, and what is signed for it, is the
	// ingress's own gate's to decide, so the two never disagree.
	c, err := console.New(console.Config{
		Token:     cfg.Token,
		Tokens:    checked,
		JS:        cfg.ConsoleJS,
		Docs:      cfg.ConsoleDocs,
		Publisher: publisher.New(cfg.ConsoleJS, publisher.WithSource(console.Source)),
		Signer:    gate,
		// The payload view checks envelopes with the keys the newest
		// stored event is checked with, the workers' controller keys.
		ControllerKeys: cfg.Controller,
		TraceURL:       cfg.TraceURL,
		Log:            cfg.Log.With().Str("component", "console").Logger(),
	})
	if err != nil {
		return nil, err
	}
	c.Mount(mux)
	return &Gateway{mux: mux}, nil
}

// newGate opens the scoped tokens and builds the signing gate the ingress
// and the console share.
func newGate(cfg Config) (*tokens.Gate, *tokens.Dir, error) {
	var dir *tokens.Dir
	var err error
	if cfg.TokensDir != "" {
		if dir, err = tokens.OpenDir(cfg.TokensDir, cfg.Verifier); err != nil {
			return nil, nil, fmt.Errorf("--tokens-dir: %w", err)
		}
	}
	gc := tokens.GateConfig{Tokens: dir, Signer: cfg.Signer, Controller: cfg.Controller, NC: cfg.NC, Audit: cfg.Audit,
		Log: cfg.Log.With().Str("component", "ingress").Logger()}
	if cfg.Domain != "" {
		gc.APIPrefix = "$JS." + cfg.Domain + ".API"
	}
	gate, err := tokens.NewGate(gc)
	if err != nil {
		return nil, nil, err
	}
	return gate, dir, nil
}

// ServeHTTP implements http.Handler: /events, /, /metrics, /healthz and
// /readyz.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) { g.mux.ServeHTTP(w, r) }
