package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/gateway"
	"github.com/steward-dev/steward/internal/natsauth"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/publisher"
)

func newServeCmd(g *globals) *cobra.Command {
	var listen, token, tokenFile, signingKey, tokensDir, controllerKey, traceURL string
	var maxBody int64
	var hc publisher.ServerConfig
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the HTTP ingress: CloudEvents over HTTP into JetStream",
		Long: `Serve POST /events for consoles that cannot speak NATS: CloudEvents over HTTP
in binary mode (ce-* headers), structured mode (application/cloudevents+json)
and batch mode (application/cloudevents-batch+json), with a bearer token and a
body size limit. Answers 202 with each event's id, stream sequence and
duplicate flag; 400 naming what is wrong (nothing of a refused batch is
stored); 401 without the token; 413 over --max-body; 503 when NATS cannot
store the event. /metrics, /healthz and /readyz are served on the same port.

It listens on 127.0.0.1 unless --listen says otherwise, serves HTTPS with
--tls-cert and --tls-key, and bounds what any client may hold: headers within
5s, a whole request within 30s, an idle keep-alive 60s, at most --max-conns
connections at once. A request without the token is answered 401 without its
body being read, and its connection is closed.

credential.rotated and grant.changed hand out access, so workers take them
only signed by the controller, and the ingress signs them (--signing-key, the
controller's ed25519 private key) only for a scoped token: a token the
operator issued with steward token issue, whose document in --tokens-dir names
the types it may publish, the hives or machines, and the window above the
newest signed version or generation stored on the key. Every signature is an
audit event on steward.outcomes.ingress.<token>. The folder is read again on
every request, so steward token revoke ends a token at once. The console's
login takes the same tokens and signs through the same check.

The unscoped --token-file token publishes only release.published,
invitation.written and hostfloor.published: it never has anything signed.`,
		Example: `  STEWARD_TOKEN_FILE=/run/secrets/ingress-token steward serve --listen :8443 \
    --tls-cert /etc/steward/ingress.crt --tls-key /etc/steward/ingress.key
  curl -H "Authorization: Bearer $TOKEN" -H 'ce-specversion: 1.0' \
    -H 'ce-type: dev.steward.release.published.v1' -H 'ce-source: /console' \
    -H 'ce-id: rel-1.2.3' -H 'ce-subject: 1.2.3' -H 'content-type: application/json' \
    -d '{"version":"1.2.3"}' http://127.0.0.1:8080/events`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := gateway.CheckTraceURL(traceURL); err != nil {
				return err
			}
			tok, err := readToken(token, tokenFile, tokensDir != "")
			if err != nil {
				return err
			}
			signer, err := loadSigner(signingKey)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			nc, js, err := g.connect(ctx, "steward serve", true)
			if err != nil {
				return err
			}
			defer nc.Close()
			// The ingress is a publisher: on a closed bus it may not call
			// the JetStream API, and creating streams is the operator's
			// (steward setup). On an open bus it still creates what is
			// missing; a refusal is only logged, and a missing stream
			// shows as a publish error naming it.
			if err := events.CreateMissingStreams(ctx, js, streamConfig(g)); err != nil {
				g.log.Warn().Err(err).Msg("the streams could not be checked with these credentials; publishing needs them to exist (steward setup)")
			}
			reg := newRegistry()
			gw, err := newGateway(g, nc, js, reg, ingressOptions{token: tok, tokensDir: tokensDir, maxBody: maxBody, signer: signer, controllerKeys: controllerKey, traceURL: traceURL}, natsReady(nc))
			if err != nil {
				return err
			}
			srv, err := publisher.NewServer(listen, gw, hc)
			if err != nil {
				return fmt.Errorf("--listen: %w", err)
			}
			served := make(chan error, 1)
			go func() { served <- srv.Serve() }()
			defer func() {
				sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				defer cancel()
				_ = srv.Shutdown(sctx)
				<-served
			}()
			if g.httpAddr != "" && g.httpAddr != listen {
				_, stopMetrics, err := serveHTTP(ctx, g.log, g.httpAddr, ops.NewServeMux(reg, natsReady(nc)))
				if err != nil {
					return fmt.Errorf("--http-addr: %w", err)
				}
				defer stopMetrics()
			}
			g.log.Info().Str("addr", srv.Addr()).Bool("tls", hc.CertFile != "").Str("path", publisher.IngressPath).Int64("max_body", maxBody).Msg("ingress serving")
			fmt.Fprintf(cmd.OutOrStdout(), "ingress listening on %s%s\n", srv.URL(), publisher.IngressPath)
			select {
			case <-ctx.Done():
			case err := <-served:
				served <- err
				return fmt.Errorf("the ingress stopped serving: %w", err)
			}
			g.log.Info().Msg("ingress stopping")
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&listen, "listen", "127.0.0.1:8080", "address the ingress listens on (:8080 is every interface: put TLS or a proxy in front)")
	fs.StringVar(&token, "token", "", "the unscoped bearer token (prefer --token-file: a flag shows in ps); it publishes only types the controller never signs")
	fs.StringVar(&tokenFile, "token-file", "", "file holding the unscoped bearer token")
	fs.StringVar(&signingKey, "signing-key", "", "the controller's ed25519 private key (PEM) that signs credential.rotated and grant.changed for scoped tokens, within their windows (without it they are refused)")
	fs.StringVar(&tokensDir, "tokens-dir", "", "folder of scoped token documents (steward token issue --dir); read again on every request")
	fs.StringVar(&controllerKey, "controller-key", "", "the controller public keys the newest stored event of a key is verified with, and the console's payload view checks envelopes with, as the workers take them (default: --signing-key's public key)")
	fs.StringVar(&traceURL, "trace-url", "", "link the console's trace ids to a trace UI: an http(s) address with {traceId} where the id goes, e.g. https://jaeger.example/trace/{traceId}")
	fs.Int64Var(&maxBody, "max-body", publisher.DefaultMaxBody, "largest request body accepted, in bytes")
	fs.StringVar(&hc.CertFile, "tls-cert", "", "PEM certificate chain to serve HTTPS with (with --tls-key)")
	fs.StringVar(&hc.KeyFile, "tls-key", "", "PEM private key of --tls-cert")
	fs.IntVar(&hc.MaxConns, "max-conns", publisher.DefaultServerConfig().MaxConns, "most client connections open at once; over it idle ones are closed and new ones refused")
	return cmd
}

// ingressOptions are who the ingress accepts and what it may sign.
type ingressOptions struct {
	// token is the one unscoped token (--token-file); tokensDir holds the
	// scoped tokens' documents (--tokens-dir).
	token, tokensDir string
	maxBody          int64
	// signer is the controller key (--signing-key); controllerKeys verify
	// the newest event stored on a key (default: the signer's public key).
	signer         *signing.EventSigner
	controllerKeys string
	// traceURL links the console's trace ids (--trace-url).
	traceURL string
}

// newGateway configures the ingress, its signing gate and the console (the
// gateway) as g: nc and js are the ingress's connection (a publisher's),
// and the console's too, whose credentials must then allow what it reads
// (an operator's).
func newGateway(g *globals, nc *nats.Conn, js jetstream.JetStream, reg *prometheus.Registry, o ingressOptions, ready func() error) (*gateway.Gateway, error) {
	// The ingress's own identity signs its audit events, and believes
	// token documents the operator signed (certified by its credentials'
	// account, or pinned with --document-trust).
	audit, verifier, err := g.documentKeys(g.credsName())
	if err != nil {
		return nil, err
	}
	cfg := gateway.Config{Token: o.token, TokensDir: o.tokensDir, Verifier: verifier, MaxBody: o.maxBody, Signer: o.signer,
		NC: nc, JS: js, Audit: audit, Domain: g.jsDomain, ConsoleJS: js, Registry: reg, Ready: ready, TraceURL: o.traceURL, Log: g.log}
	// The console checks envelopes with these keys too, so they are read
	// even when this ingress signs nothing.
	if o.controllerKeys != "" {
		if cfg.Controller, err = signing.LoadEnvelopeKeys(o.controllerKeys); err != nil {
			return nil, fmt.Errorf("--controller-key: %w", err)
		}
	}
	if g.credsName() != string(natsauth.RolePublisher) {
		cfg.ConsoleDocs, err = g.documents(context.Background(), js)
	}
	if err != nil {
		// An identity that may not read the bucket (the ingress is a
		// publisher) still serves the console; its pages then show what
		// they can, and documents unverified.
		g.log.Warn().Err(err).Msg("the console cannot read the checkpoint bucket with these credentials; status documents are not shown verified, and stream readers cannot be paused from it")
	}
	return gateway.New(cfg)
}

// readToken takes the unscoped token from --token or --token-file, never
// both; none is allowed when scoped tokens are served.
func readToken(token, file string, scoped bool) (string, error) {
	switch {
	case token != "" && file != "":
		return "", errors.New("--token and --token-file both given: keep one")
	case file != "":
		raw, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("--token-file: %w", err)
		}
		token = strings.TrimSpace(string(raw))
		if token == "" {
			return "", fmt.Errorf("--token-file %s is empty", file)
		}
	case token == "" && !scoped:
		return "", errors.New("--token, --token-file or --tokens-dir is required: the ingress publishes to the bus and is never open")
	}
	return token, nil
}

func natsReady(nc *nats.Conn) func() error {
	return func() error {
		if !nc.IsConnected() {
			return fmt.Errorf("NATS is %s", nc.Status())
		}
		return nil
	}
}

// streamConfig is the default stream layout with --replicas.
func streamConfig(g *globals) events.StreamConfig {
	sc := events.DefaultStreamConfig()
	sc.Replicas = g.replicas
	return sc
}
