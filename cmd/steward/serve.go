package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers"
)

func newServeCmd(g *globals) *cobra.Command {
	var listen, token, tokenFile string
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
body being read, and its connection is closed.`,
		Example: `  STEWARD_TOKEN_FILE=/run/secrets/ingress-token steward serve --listen :8443 \
    --tls-cert /etc/steward/ingress.crt --tls-key /etc/steward/ingress.key
  curl -H "Authorization: Bearer $TOKEN" -H 'ce-specversion: 1.0' \
    -H 'ce-type: dev.steward.release.published.v1' -H 'ce-source: /console' \
    -H 'ce-id: rel-1.2.3' -H 'ce-subject: 1.2.3' -H 'content-type: application/json' \
    -d '{"version":"1.2.3"}' http://127.0.0.1:8080/events`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tok, err := readToken(token, tokenFile)
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
			mux, err := ingressMux(g, js, reg, tok, maxBody, natsReady(nc))
			if err != nil {
				return err
			}
			// The console reads status, history and dead letters: its
			// credentials must allow that (an operator's).
			if err := mountConsole(mux, g, js, tok, nil); err != nil {
				return err
			}
			srv, err := publisher.NewServer(listen, mux, hc)
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
				_, stopMetrics, err := serveHTTP(ctx, g.log, g.httpAddr, workers.NewServeMux(reg, natsReady(nc)))
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
	fs.StringVar(&token, "token", "", "the bearer token requests must carry (prefer --token-file: a flag shows in ps)")
	fs.StringVar(&tokenFile, "token-file", "", "file holding the bearer token")
	fs.Int64Var(&maxBody, "max-body", publisher.DefaultMaxBody, "largest request body accepted, in bytes")
	fs.StringVar(&hc.CertFile, "tls-cert", "", "PEM certificate chain to serve HTTPS with (with --tls-key)")
	fs.StringVar(&hc.KeyFile, "tls-key", "", "PEM private key of --tls-cert")
	fs.IntVar(&hc.MaxConns, "max-conns", publisher.DefaultServerConfig().MaxConns, "most client connections open at once; over it idle ones are closed and new ones refused")
	return cmd
}

// ingressMux serves the ingress on /events and metrics and health beside it.
func ingressMux(g *globals, js jetstream.JetStream, reg *prometheus.Registry, token string, maxBody int64, ready func() error) (*http.ServeMux, error) {
	in, err := publisher.NewIngress(publisher.New(js), publisher.IngressConfig{
		Token:   token,
		MaxBody: maxBody,
		Log:     g.log.With().Str("component", "ingress").Logger(),
	})
	if err != nil {
		return nil, err
	}
	mux := workers.NewServeMux(reg, ready)
	mux.Handle(publisher.IngressPath, in)
	return mux, nil
}

// readToken takes the token from --token or --token-file, never both.
func readToken(token, file string) (string, error) {
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
	case token == "":
		return "", errors.New("--token or --token-file is required: the ingress publishes to the bus and is never open")
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
