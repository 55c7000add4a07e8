package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/rs/zerolog"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/console"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers"
)

func newServeCmd(g *globals) *cobra.Command {
	var listen, token, tokenFile, signingKey string
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
only signed by the controller. With --signing-key (the controller's ed25519
private key) the ingress validates each such event of an authenticated caller
and signs it before it is stored, and the console signs what it publishes
with the same key; without one it refuses them with 403 naming the rule, and
the console says it cannot publish them.`,
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
			mux, err := ingressMux(g, js, reg, tok, maxBody, natsReady(nc), signer)
			if err != nil {
				return err
			}
			// The console reads status, history and dead letters: its
			// credentials must allow that (an operator's).
			if err := mountConsole(mux, g, js, tok, consoleSigner(signer)); err != nil {
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
	fs.StringVar(&signingKey, "signing-key", "", "the controller's ed25519 private key (PEM) that signs credential.rotated and grant.changed of authenticated callers (without it they are refused)")
	fs.Int64Var(&maxBody, "max-body", publisher.DefaultMaxBody, "largest request body accepted, in bytes")
	fs.StringVar(&hc.CertFile, "tls-cert", "", "PEM certificate chain to serve HTTPS with (with --tls-key)")
	fs.StringVar(&hc.KeyFile, "tls-key", "", "PEM private key of --tls-cert")
	fs.IntVar(&hc.MaxConns, "max-conns", publisher.DefaultServerConfig().MaxConns, "most client connections open at once; over it idle ones are closed and new ones refused")
	return cmd
}

// ingressMux serves the ingress on /events and metrics and health beside it.
// signer signs credential.rotated and grant.changed of authenticated
// callers; nil refuses them (signingIngress).
func ingressMux(g *globals, js jetstream.JetStream, reg *prometheus.Registry, token string, maxBody int64, ready func() error, signer *signing.EventSigner) (*http.ServeMux, error) {
	if maxBody <= 0 {
		maxBody = publisher.DefaultMaxBody
	}
	log := g.log.With().Str("component", "ingress").Logger()
	in, err := publisher.NewIngress(publisher.New(js, publisher.WithRegisterer(reg)), publisher.IngressConfig{
		Token: token,
		// signingIngress has bounded every authenticated body to maxBody
		// already; what it hands on holds the envelopes it added too.
		MaxBody: 2*maxBody + signedOverhead,
		Log:     log,
	})
	if err != nil {
		return nil, err
	}
	mux := workers.NewServeMux(reg, ready)
	mux.Handle(publisher.IngressPath, &signingIngress{
		next: in, tokenHash: sha256.Sum256([]byte(token)), maxBody: maxBody,
		signer: signer, pub: publisher.New(nil), log: log,
	})
	return mux, nil
}

// signedOverhead bounds what signing adds to a request beyond doubling
// it (a grant's payload repeats its consumers): the envelopes' base64 and
// signatures.
const signedOverhead = 64 << 10

// consoleSigner is signer as the console's hook: nil stays an untyped nil,
// so the console knows it has none.
func consoleSigner(signer *signing.EventSigner) console.Signer {
	if signer == nil {
		return nil
	}
	return signer
}

// signingIngress stands in front of the ingress (publisher.Ingress, which
// has no hook of its own) and enforces docs/design.md §7 there: credential.rotated
// and grant.changed from a caller with the bearer token are validated and
// then signed with the controller key before the ingress stores them;
// with no key they are refused with 403, and nothing of the request is
// stored. Every other request goes to the ingress as it came, so its
// answers (401 without reading the body, 404, 405, 400) stay its own.
type signingIngress struct {
	next      http.Handler
	tokenHash [sha256.Size]byte
	maxBody   int64
	signer    *signing.EventSigner
	// pub only prepares (fills and validates) events; it publishes none.
	pub *publisher.Publisher
	log zerolog.Logger
}

func (s *signingIngress) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != publisher.IngressPath || r.Method != http.MethodPost || !s.authorized(r) {
		s.next.ServeHTTP(w, r)
		return
	}
	if r.ContentLength > s.maxBody {
		s.reply(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is %d bytes, over the limit of %d", r.ContentLength, s.maxBody))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			s.reply(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is over the limit of %d bytes", s.maxBody))
			return
		}
		s.reply(w, r, http.StatusBadRequest, "the body could not be read: "+err.Error())
		return
	}
	list, err := decodeCloudEvents(r, body)
	if err != nil || !slices.ContainsFunc(list, func(e event.Event) bool { return signing.MustSign(e.Type()) }) {
		// Nothing to sign, or nothing the ingress can read: it answers.
		r.Body = io.NopCloser(bytes.NewReader(body))
		s.next.ServeHTTP(w, r)
		return
	}
	for i := range list {
		if !signing.MustSign(list[i].Type()) {
			continue
		}
		if s.signer == nil {
			s.reply(w, r, http.StatusForbidden, describeIn(len(list), i, fmt.Sprintf(
				"%s for %s must be signed by the controller (docs/design.md §7: desired state that hands out access is accepted only signed), and this ingress has no --signing-key, so nothing of the request was stored; start steward serve with --signing-key, or publish it with steward publish --signing-key",
				list[i].Type(), list[i].Subject())))
			return
		}
		// Validated first: the signature vouches only for data the schema
		// takes.
		if _, err := s.pub.Prepare(&list[i]); err != nil {
			s.reply(w, r, http.StatusBadRequest, describeIn(len(list), i, err.Error()))
			return
		}
		signed, err := s.signer.Sign(r.Context(), list[i])
		if err != nil {
			s.reply(w, r, http.StatusBadRequest, describeIn(len(list), i, err.Error()+"; nothing of the request was stored"))
			return
		}
		list[i] = signed
	}
	raw, err := json.Marshal(list)
	if err != nil {
		s.reply(w, r, http.StatusInternalServerError, "the signed events could not be encoded: "+err.Error())
		return
	}
	// Handed on as a batch: the ingress answers for each event as it
	// would have, in the same order.
	out := r.Clone(r.Context())
	for name := range out.Header {
		if strings.HasPrefix(strings.ToLower(name), "ce-") {
			out.Header.Del(name)
		}
	}
	out.Header.Set("Content-Type", "application/cloudevents-batch+json")
	out.Body = io.NopCloser(bytes.NewReader(raw))
	out.ContentLength = int64(len(raw))
	s.next.ServeHTTP(w, out)
}

// authorized is the ingress's own token check (constant time in the
// token's content and length); a caller without it is the ingress's to
// answer, with 401 and without its body being read.
func (s *signingIngress) authorized(r *http.Request) bool {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	return subtle.ConstantTimeCompare(got[:], s.tokenHash[:]) == 1
}

func (s *signingIngress) reply(w http.ResponseWriter, r *http.Request, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(publisher.IngressResponse{Error: msg})
	s.log.Warn().Str("error", msg).Str("method", r.Method).Str("path", r.URL.Path).Int("status", status).Msg("ingress request")
}

// describeIn names the event a refusal is about when the request held
// several, as the ingress does.
func describeIn(n, i int, msg string) string {
	if n == 1 {
		return msg
	}
	return fmt.Sprintf("event %d of %d in the batch (counting from 0): %s", i, n, msg)
}

// decodeCloudEvents reads the CloudEvents of a request in any of the three
// HTTP content modes, as the ingress does.
func decodeCloudEvents(r *http.Request, body []byte) ([]event.Event, error) {
	msg := cehttp.NewMessage(r.Header, io.NopCloser(bytes.NewReader(body)))
	defer msg.Finish(nil)
	ctx := context.WithoutCancel(r.Context())
	switch msg.ReadEncoding() {
	case binding.EncodingBatch:
		return binding.ToEvents(ctx, msg, bytes.NewReader(body))
	case binding.EncodingBinary, binding.EncodingStructured:
		e, err := binding.ToEvent(ctx, msg)
		if err != nil {
			return nil, err
		}
		return []event.Event{*e}, nil
	}
	return nil, errors.New("not a CloudEvent")
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
