// Package console is Steward's web console: the pages an operator reads
// (overview, the history of a key, dead letters) and the actions they take
// (pause and resume an instance, retry or remove dead letters, publish an
// event), served on the ingress's port under /, behind the ingress token.
//
// The console computes nothing of its own. Every page is what internal/ops
// computes for `steward status`, `steward history` and `steward dlq`, and
// every action (pause, resume, retry, remove) is the ops call those
// commands make, with the same filter, safety rules and audit lines;
// publishing goes through the publisher the ingress and `steward publish`
// use. So the console and the command line never disagree.
//
// HTML comes from Go templates and the few scripts are plain JavaScript,
// all embedded: building or running Steward needs no Node toolchain. Secrets
// are sealed with age in the page (static/vendor/age.js, age-encryption
// 0.3.1), so their plaintext never reaches the server.
package console

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/publisher"
)

//go:embed templates/*.html
var templateFiles embed.FS

//go:embed static
var staticFiles embed.FS

// Source is the CloudEvents source of events published from the console.
const Source = "/steward/console"

// DefaultSessionTTL is how long a login lasts.
const DefaultSessionTTL = 12 * time.Hour

// Signer decides what a logged-in caller may publish and signs desired
// state that hands out access (grant.changed, credential.rotated) with the
// controller key: the ingress's own signing hook (tokens.Gate, `steward
// serve --signing-key`), so the console and the ingress decide the same
// way for the same token. The console calls it with the caller its login
// authenticated and the event exactly as the page sent it: its secrets
// already sealed in the browser, so the signature is over the ciphertext
// and the signer never sees a plaintext.
type Signer interface {
	// Sign returns the event to publish in place of e, or why it is
	// refused (wrapping publisher.ErrForbidden or ErrUnavailable). An
	// error is shown to the operator as it is, so it must name what is
	// wrong and what to do, and never quote the data.
	Sign(ctx context.Context, caller publisher.Caller, e event.Event) (event.Event, error)
	// HasKey reports whether it can sign at all.
	HasKey() bool
}

// SignedTypes are the event types that must be signed before they are
// published; without a Signer the console refuses them and says why.
var SignedTypes = []string{events.TypeCredentialRotated, events.TypeGrantChanged}

func mustSign(typ string) bool {
	for _, t := range SignedTypes {
		if t == typ {
			return true
		}
	}
	return false
}

// Config configures a Console.
type Config struct {
	// Token is the unscoped ingress token, one login; Tokens are the
	// scoped ones (steward token issue). One of them is required. What a
	// login may publish is the Signer's to decide for its caller.
	Token  string
	Tokens publisher.Tokens
	// JS is the operator's connection: the pages read status and history
	// through it, and pause and resume act through it. Required.
	JS jetstream.JetStream
	// Docs reads and writes the checkpoint bucket as the operator: status
	// documents and checkpoints are verified as their instances', a pause
	// is signed as the operator's (docs/design.md §7). Nil shows documents
	// unverified and cannot pause a stream reader.
	Docs *events.Store
	// Publisher publishes what the publish form sends (the ingress's and
	// `steward publish`'s code). Required.
	Publisher *publisher.Publisher
	// Signer decides for each caller and signs grant.changed and
	// credential.rotated; nil means this console cannot publish them, and
	// their forms say so.
	Signer Signer
	// ControllerKeys verify the envelopes of credential.rotated and
	// grant.changed in a payload view, as the workers verify them; nil
	// shows them as not checked.
	ControllerKeys *signing.KeySet
	// TraceURL, when set, links every trace id to a trace UI: an http or
	// https address with TraceIDPlaceholder where the id goes
	// (CheckTraceURL).
	TraceURL string
	// SessionTTL is how long a login lasts (default DefaultSessionTTL).
	SessionTTL time.Duration
	// Log receives one line per refused login and per action, and the
	// audit line of every dead letter acted on (never a token, a cookie or
	// event data); the zero value discards.
	Log zerolog.Logger
	// Now is the clock (default time.Now); tests set it.
	Now func() time.Time
}

// Console serves the web console. Mount it with Mount.
type Console struct {
	cfg      Config
	tokens   *publisher.TokenCheck
	sessions *sessions
	pages    map[string]*template.Template
	static   http.Handler
	mux      *http.ServeMux
	cop      *http.CrossOriginProtection
	logins   *loginLimiter
	// times remembers the streams' sequences at past minutes, so the
	// overview's charts ask the server only for the newest minute.
	times *ops.TimeIndex
}

// New checks cfg and returns the console.
func New(cfg Config) (*Console, error) {
	switch {
	case strings.TrimSpace(cfg.Token) == "" && cfg.Tokens == nil:
		return nil, errors.New("the console needs a login: the ingress token (--token-file) or scoped tokens (--tokens-dir)")
	case cfg.JS == nil:
		return nil, errors.New("the console has no NATS connection: it needs the operator's, to read status and history")
	case cfg.Publisher == nil:
		return nil, errors.New("the console has no publisher: it publishes what an operator submits, so it needs the ingress's (Config.Publisher)")
	}
	if cfg.TraceURL != "" {
		if err := CheckTraceURL(cfg.TraceURL); err != nil {
			return nil, fmt.Errorf("the console's trace URL: %w", err)
		}
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	pages, err := parseTemplates(cfg.TraceURL)
	if err != nil {
		return nil, err
	}
	sub, err := fs.Sub(staticFiles, "static")
	if err != nil {
		return nil, err
	}
	c := &Console{
		cfg:      cfg,
		tokens:   publisher.NewTokenCheck(cfg.Token, cfg.Tokens),
		sessions: newSessions(cfg.SessionTTL, cfg.Now),
		pages:    pages,
		static:   http.StripPrefix("/static/", http.FileServerFS(sub)),
		cop:      http.NewCrossOriginProtection(),
		logins:   newLoginLimiter(cfg.Now),
		times:    ops.NewTimeIndex(),
	}
	c.routes()
	return c, nil
}

// Mount serves the console on mux under /. The ingress (/events), metrics
// and health keep their own, more specific, patterns.
func (c *Console) Mount(mux *http.ServeMux) { mux.Handle("/", c) }

// ServeHTTP implements http.Handler.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// The console shows what the bus holds, which anyone who can publish
	// may have written: no inline script runs, nothing loads from
	// elsewhere, no other site may frame it, and nothing is cached.
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cache-Control", "no-store")
	// A cross-site request that changes state is refused before anything
	// else looks at it (Sec-Fetch-Site, then Origin against Host); the
	// per-session CSRF token below is the second lock.
	if err := c.cop.Check(r); err != nil {
		c.fail(w, r, http.StatusForbidden, "refused: this request came from another site. Use the console's own pages.")
		return
	}
	c.mux.ServeHTTP(w, r)
}
