package publisher

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/rs/zerolog"
)

// IngressPath is where the ingress takes events.
const IngressPath = "/events"

// DefaultMaxBody bounds a request body: a batch of signed envelopes fits
// many times over, a runaway upload does not.
const DefaultMaxBody = 1 << 20

// IngressConfig configures an Ingress.
type IngressConfig struct {
	// Token is the one unscoped bearer token (--token-file): its caller is
	// Caller{Token: LegacyToken}. Token or Tokens is required: the ingress
	// publishes to the bus, so it is never open.
	Token string
	// Tokens authenticates scoped tokens (steward token issue); nil
	// accepts only Token.
	Tokens Tokens
	// Sign runs on every event of an authenticated request after it is
	// decoded and validated, and before anything of the request is
	// stored: it returns the event to store (signed, for the types that
	// must be), or an error that refuses the whole request (wrap
	// ErrForbidden for 403, ErrUnavailable for 503; anything else is
	// 400). Nil stores events as they came.
	Sign SignHook
	// MaxBody is the largest request body accepted, in bytes (default
	// DefaultMaxBody).
	MaxBody int64
	// Log receives one line per request (never the token or the data);
	// the zero value discards.
	Log zerolog.Logger
}

// LegacyToken names the caller of the unscoped IngressConfig.Token.
const LegacyToken = "ingress-token"

// Caller is who an ingress request (or a console login) authenticated as.
// The ingress hands it to the Sign hook, so what may be signed is decided
// by who asks, not by holding some token.
type Caller struct {
	// Token names the token: a scoped token's name, or LegacyToken.
	Token string
	// Scoped is true for a token issued as a document (Tokens), false for
	// the unscoped IngressConfig.Token.
	Scoped bool
	// Via says where the request came in ("ingress", "console"), for the
	// audit trail.
	Via string
}

// Tokens authenticates scoped bearer tokens.
type Tokens interface {
	// Authenticate returns the caller token is issued to, and false when
	// it is no current token (unknown, revoked, expired). It compares in
	// constant time and never logs or returns the token.
	Authenticate(token string) (Caller, bool)
}

// SignHook is IngressConfig.Sign: it sees each validated event with the
// caller that sent it.
type SignHook func(ctx context.Context, caller Caller, e event.Event) (event.Event, error)

// Errors a SignHook wraps to choose the ingress's answer.
var (
	// ErrForbidden: the caller may not have this event stored (403).
	ErrForbidden = errors.New("forbidden")
	// ErrUnavailable: what the decision needs cannot be read now (503,
	// with Retry-After).
	ErrUnavailable = errors.New("unavailable")
)

// Ingress is the HTTP entry for consoles that cannot speak NATS: POST
// /events takes CloudEvents over HTTP in binary mode (ce-* headers),
// structured mode (application/cloudevents+json) or batch mode
// (application/cloudevents-batch+json), checks them with the same
// validation as Publish, and publishes them.
type Ingress struct {
	pub     *Publisher
	check   *TokenCheck
	sign    SignHook
	maxBody int64
	log     zerolog.Logger
}

// NewIngress returns the ingress publishing through p.
func NewIngress(p *Publisher, cfg IngressConfig) (*Ingress, error) {
	if strings.TrimSpace(cfg.Token) == "" && cfg.Tokens == nil {
		return nil, errors.New("the ingress has no token: give --token-file or --tokens-dir, since an open ingress would let anyone publish")
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	return &Ingress{pub: p, check: NewTokenCheck(cfg.Token, cfg.Tokens), sign: cfg.Sign, maxBody: cfg.MaxBody, log: cfg.Log}, nil
}

// IngressResponse is the JSON body of every ingress response: the stored
// events on 202 (in request order), or what is wrong otherwise.
type IngressResponse struct {
	Events []Ack  `json:"events,omitempty"`
	Error  string `json:"error,omitempty"`
}

// ServeHTTP implements http.Handler.
func (in *Ingress) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != IngressPath {
		in.refuse(w, r, http.StatusNotFound, IngressResponse{Error: fmt.Sprintf("no such path %q: events are posted to %s", r.URL.Path, IngressPath)})
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		in.refuse(w, r, http.StatusMethodNotAllowed, IngressResponse{Error: fmt.Sprintf("method %s is not allowed: events are sent with POST", r.Method)})
		return
	}
	caller, challenge, reason := in.authorize(r)
	if challenge != "" {
		// The body of a caller without the token is never read, and its
		// connection is closed after the answer: holding it open (or
		// trickling a body into it) costs an unauthenticated client
		// nothing and the ingress a file descriptor.
		w.Header().Set("WWW-Authenticate", challenge)
		in.refuse(w, r, http.StatusUnauthorized, IngressResponse{Error: reason})
		return
	}
	if r.ContentLength > in.maxBody {
		in.refuse(w, r, http.StatusRequestEntityTooLarge, IngressResponse{Error: fmt.Sprintf("the body is %d bytes, over the limit of %d", r.ContentLength, in.maxBody)})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, in.maxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			in.refuse(w, r, http.StatusRequestEntityTooLarge, IngressResponse{Error: fmt.Sprintf("the body is over the limit of %d bytes", in.maxBody)})
			return
		}
		in.reply(w, r, http.StatusBadRequest, IngressResponse{Error: "the body could not be read: " + err.Error()})
		return
	}
	list, err := decodeRequest(r, body)
	if err != nil {
		in.reply(w, r, http.StatusBadRequest, IngressResponse{Error: err.Error()})
		return
	}
	// Every event is checked before any is published, so a batch with one
	// bad event stores nothing and the console can fix and resend it whole.
	for i := range list {
		if _, err := in.pub.Prepare(&list[i]); err != nil {
			in.reply(w, r, http.StatusBadRequest, IngressResponse{Error: describe(len(list), i, err)})
			return
		}
	}
	// The hook sees only valid events (a signature vouches for nothing the
	// schema refuses), all of them before any is stored.
	if in.sign != nil {
		for i := range list {
			out, err := in.sign(r.Context(), caller, list[i])
			if err != nil {
				status := http.StatusBadRequest
				switch {
				case errors.Is(err, ErrForbidden):
					status = http.StatusForbidden
				case errors.Is(err, ErrUnavailable):
					status = http.StatusServiceUnavailable
					w.Header().Set("Retry-After", "5")
				}
				in.reply(w, r, status, IngressResponse{Error: describe(len(list), i, err)})
				return
			}
			list[i] = out
		}
	}
	acks := make([]Ack, 0, len(list))
	for i, e := range list {
		ack, err := in.pub.Publish(r.Context(), e)
		if err != nil {
			if IsInvalid(err) {
				in.reply(w, r, http.StatusBadRequest, IngressResponse{Events: acks, Error: describe(len(list), i, err)})
				return
			}
			msg := describe(len(list), i, err) + "; NATS did not store it, and resending the request is safe since event ids deduplicate"
			if i > 0 {
				msg += fmt.Sprintf(" (the %d events before it are stored)", i)
			}
			w.Header().Set("Retry-After", "5")
			in.reply(w, r, http.StatusServiceUnavailable, IngressResponse{Events: acks, Error: msg})
			return
		}
		acks = append(acks, ack)
	}
	in.reply(w, r, http.StatusAccepted, IngressResponse{Events: acks})
}

// authorize returns the caller when the request carries a token, or the
// challenge (RFC 6750: no error code when no token was sent) and reason to
// refuse it with.
func (in *Ingress) authorize(r *http.Request) (caller Caller, challenge, reason string) {
	const realm = `Bearer realm="steward"`
	h := r.Header.Get("Authorization")
	if h == "" {
		return Caller{}, realm, "no Authorization header: send Authorization: Bearer <token>"
	}
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return Caller{}, realm + `, error="invalid_request"`, "the Authorization header is not a bearer token: send Authorization: Bearer <token>"
	}
	if c, ok := in.check.Authenticate(token); ok {
		c.Via = "ingress"
		return c, "", ""
	}
	return Caller{}, realm + `, error="invalid_token"`, "the bearer token is not one this ingress accepts (the ingress token, or a scoped token not revoked or expired): ask the operator for one (steward token issue)"
}

// decodeRequest reads the CloudEvents of a request in any of the three HTTP
// content modes.
func decodeRequest(r *http.Request, body []byte) ([]event.Event, error) {
	msg := cehttp.NewMessage(r.Header, io.NopCloser(bytes.NewReader(body)))
	defer msg.Finish(nil)
	ctx := context.WithoutCancel(r.Context())
	switch msg.ReadEncoding() {
	case binding.EncodingBatch:
		list, err := binding.ToEvents(ctx, msg, bytes.NewReader(body))
		if err != nil {
			return nil, fmt.Errorf("the batch is not a JSON array of CloudEvents: %v", err)
		}
		if len(list) == 0 {
			return nil, errors.New("the batch holds no events")
		}
		return list, nil
	case binding.EncodingBinary, binding.EncodingStructured:
		e, err := binding.ToEvent(ctx, msg)
		if err != nil {
			return nil, fmt.Errorf("the body is not a CloudEvent: %v", err)
		}
		return []event.Event{*e}, nil
	}
	return nil, fmt.Errorf("not a CloudEvent: no ce-specversion header (binary mode) and content-type %q is neither application/cloudevents+json nor application/cloudevents-batch+json", r.Header.Get("Content-Type"))
}

// describe names the event a refusal is about when the request held several.
func describe(n, i int, err error) string {
	if n == 1 {
		return err.Error()
	}
	return fmt.Sprintf("event %d of %d in the batch (counting from 0): %v", i, n, err)
}

// refuse answers a request whose body is not read (no token, too large,
// wrong path or method) and closes its connection. Connection: close alone
// is not enough: after the handler, net/http still reads up to 256 KiB of
// an unread body so it can reuse the connection, and a client that
// announces a body and never sends it would hold the connection for as
// long as it likes. A read deadline in the past ends that read at once.
func (in *Ingress) refuse(w http.ResponseWriter, r *http.Request, status int, body IngressResponse) {
	w.Header().Set("Connection", "close")
	in.reply(w, r, status, body)
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
}

func (in *Ingress) reply(w http.ResponseWriter, r *http.Request, status int, body IngressResponse) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
	ev := in.log.Info()
	if status >= 400 {
		ev = in.log.Warn().Str("error", body.Error)
	}
	ev.Str("method", r.Method).Str("path", r.URL.Path).Int("status", status).Int("events", len(body.Events)).Msg("ingress request")
}

// ServerConfig bounds what a client of the ingress may hold: every phase of
// a request has a deadline, idle keep-alive connections are closed, and the
// connections open at once are capped, so clients that hold connections
// open (slow headers, slow bodies, idle keep-alives) cannot run the
// process out of file descriptors and lock every console out. The zero
// value of a field means its default (DefaultServerConfig).
type ServerConfig struct {
	// ReadHeaderTimeout bounds reading a request's headers (and the TLS
	// handshake); ReadTimeout the whole request, body included.
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	// WriteTimeout bounds handling and answering a request, from the end
	// of its headers; it must cover a publish to NATS.
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection with no request.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers.
	MaxHeaderBytes int
	// MaxConns caps the connections open at once. When they are all
	// taken, idle ones are closed to make room, and a connection that
	// still finds none is closed at once rather than queued.
	MaxConns int
	// CertFile and KeyFile, both or neither, serve HTTPS (TLS 1.2 or
	// later) with that PEM certificate chain and private key.
	CertFile, KeyFile string
}

// DefaultServerConfig is what the ingress runs with unless told otherwise.
func DefaultServerConfig() ServerConfig {
	return ServerConfig{
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    64 << 10,
		MaxConns:          256,
	}
}

func (c ServerConfig) withDefaults() ServerConfig {
	d := DefaultServerConfig()
	if c.ReadHeaderTimeout <= 0 {
		c.ReadHeaderTimeout = d.ReadHeaderTimeout
	}
	if c.ReadTimeout <= 0 {
		c.ReadTimeout = d.ReadTimeout
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = d.WriteTimeout
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = d.IdleTimeout
	}
	if c.MaxHeaderBytes <= 0 {
		c.MaxHeaderBytes = d.MaxHeaderBytes
	}
	if c.MaxConns <= 0 {
		c.MaxConns = d.MaxConns
	}
	return c
}

// Server is an HTTP server hardened for the ingress (ServerConfig).
type Server struct {
	srv *http.Server
	ln  net.Listener
	tls bool
}

// NewServer listens on addr and returns the server that will serve h
// there. Listening happens now, so a busy port or an unreadable
// certificate is an error at start rather than a log line later.
func NewServer(addr string, h http.Handler, cfg ServerConfig) (*Server, error) {
	cfg = cfg.withDefaults()
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return nil, errors.New("TLS needs both a certificate and a key: give --tls-cert and --tls-key together, or neither for plain HTTP")
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
	}
	if cfg.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("load the TLS certificate %s and key %s: %w", cfg.CertFile, cfg.KeyFile, err)
		}
		srv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	lim := &limitListener{Listener: ln, slots: make(chan struct{}, cfg.MaxConns)}
	// Closing idle connections is what frees a slot when all are taken:
	// turning keep-alives off closes them (and connections that sent no
	// request within 5s), and they are turned on again at once.
	lim.reclaim = func() { srv.SetKeepAlivesEnabled(false); srv.SetKeepAlivesEnabled(true) }
	var l net.Listener = lim
	if srv.TLSConfig != nil {
		l = tls.NewListener(lim, srv.TLSConfig)
	}
	return &Server{srv: srv, ln: l, tls: srv.TLSConfig != nil}, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// URL is the server's base URL (https when it serves TLS).
func (s *Server) URL() string {
	if s.tls {
		return "https://" + s.Addr()
	}
	return "http://" + s.Addr()
}

// Serve serves until Shutdown; it returns nil after a shutdown.
func (s *Server) Serve() error {
	if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Shutdown stops accepting, lets requests in flight finish until ctx ends,
// and closes every connection.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if err != nil {
		_ = s.srv.Close()
	}
	return err
}

// limitListener caps the connections open at once. Over the cap it first
// asks the server to close idle connections, waits briefly for a slot,
// and otherwise closes the new connection at once: a client refused fast
// retries, a queued one would only hold a descriptor longer.
type limitListener struct {
	net.Listener
	slots   chan struct{}
	reclaim func()
}

// slotWait is how long a connection over the cap waits for a slot.
const slotWait = 500 * time.Millisecond

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &limitedConn{Conn: c, release: l.release}, nil
		default:
		}
		l.reclaim()
		t := time.NewTimer(slotWait)
		select {
		case l.slots <- struct{}{}:
			t.Stop()
			return &limitedConn{Conn: c, release: l.release}, nil
		case <-t.C:
			_ = c.Close()
		}
	}
}

func (l *limitListener) release() { <-l.slots }

// limitedConn gives its slot back once, when it is closed.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
