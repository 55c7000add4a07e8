// Command steward is Steward's one binary: the development stack (dev), a
// worker (worker), the tools to publish, serve, export, replay and inspect
// events (publish, serve, export, replay, dlq, status), development keys
// (keys) and a benchmark (bench). Every flag has an environment twin:
// --nats-url is STEWARD_NATS_URL.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/natsauth"
	"github.com/steward-dev/steward/internal/tracing"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := newRoot().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "steward:", err)
		code := 1
		var ec *exitCodeError
		if errors.As(err, &ec) {
			code = ec.code
		}
		os.Exit(code)
	}
}

// exitCodeError is an error a command exits with a code of its own for,
// documented in its help, so a script tells its answers apart without
// reading the output (join status: not armed, unknown).
type exitCodeError struct {
	code int
	err  error
}

func (e *exitCodeError) Error() string { return e.err.Error() }
func (e *exitCodeError) Unwrap() error { return e.err }

// globals holds the flags every command shares (docs/design.md §6, "all").
type globals struct {
	natsURL   string
	natsCreds string
	// natsUser and natsPasswordFile, or natsNkey (a seed file), are the
	// other ways to authenticate; secrets are named by file, never given
	// on a command line where every user of the machine can read them.
	natsUser, natsPasswordFile string
	natsNkey                   string
	// natsInbox is the reply subjects' prefix; empty: the one the
	// credentials allow (natsauth.CredsInboxPrefix), else _INBOX.
	natsInbox string
	// documentKey signs what this process stores, documentTrust pins the
	// keys of writers without a JWT, jsDomain is the JetStream domain
	// (docs/design.md §7).
	documentKey, documentTrust string
	// natsContext is --context; contextName the nats context applied;
	// urlGiven says --nats-url (or STEWARD_NATS_URL) was set.
	natsContext, contextName string
	urlGiven                 bool
	jsDomain                 string
	replicas                 int
	httpAddr                 string
	logLevel                 string
	logFormat                string

	log zerolog.Logger
	// stopTracing flushes and stops the tracer the OTEL_* environment
	// asked for (a no-op when it asked for none).
	stopTracing func(context.Context) error
}

func newRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "steward",
		Short: "Steward turns infrastructure state changes into safe, repeatable actions",
		Long: `Steward turns infrastructure state changes into safe, repeatable actions:
state changes are CloudEvents on NATS JetStream, and idempotent workers apply them.

Every flag has an environment twin, STEWARD_<FLAG> with '-' as '_'
(--nats-url is STEWARD_NATS_URL); a flag given on the command line wins.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd.Flags()); err != nil {
				return err
			}
			if err := g.applyContext(cmd.Flags()); err != nil {
				return err
			}
			if f := cmd.Flags().Lookup("nats-url"); f != nil && f.Changed {
				g.urlGiven = true
			}
			if err := g.setup(cmd.ErrOrStderr()); err != nil {
				return err
			}
			// Traces are configured only by the standard OTEL_*
			// environment, and are off when it asks for none.
			stop, err := tracing.Setup(cmd.Context(), strings.ReplaceAll(cmd.CommandPath(), " ", "-"))
			if err != nil {
				return err
			}
			g.stopTracing = stop
			return nil
		},
		PersistentPostRunE: func(cmd *cobra.Command, _ []string) error {
			if g.stopTracing == nil {
				return nil
			}
			ctx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), 5*time.Second)
			defer cancel()
			if err := g.stopTracing(ctx); err != nil {
				g.log.Warn().Err(err).Msg("traces not flushed")
			}
			return nil
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.natsURL, "nats-url", nats.DefaultURL, "NATS server URL(s), comma-separated")
	pf.StringVar(&g.natsContext, "context", "", "a nats CLI context (nats context save) naming the server and credentials; NATS_CONTEXT works too, and the selected one is read when no server or credentials are given")
	pf.StringVar(&g.natsCreds, "nats-creds", "", "NATS credentials file (user JWT and nkey seed), as steward creds issue and steward dev write them")
	pf.StringVar(&g.natsUser, "nats-user", "", "NATS user name, with --nats-password-file (instead of --nats-creds)")
	pf.StringVar(&g.natsPasswordFile, "nats-password-file", "", "file holding the NATS password of --nats-user")
	pf.StringVar(&g.natsNkey, "nats-nkey", "", "NATS nkey seed file (instead of --nats-creds)")
	pf.StringVar(&g.natsInbox, "nats-inbox-prefix", "", "prefix of reply subjects (empty: the one --nats-creds allows, else _INBOX)")
	pf.StringVar(&g.documentKey, "document-key", "", "the key this identity signs what it stores with (PEM PKCS#8 ed25519; empty: the .dockey beside --nats-creds, as steward creds issue writes it)")
	pf.StringVar(&g.documentTrust, "document-trust", "", "document keys of writers without a JWT to believe, as <writer>=<public key PEM> separated by commas (operator=operator.pub)")
	pf.StringVar(&g.jsDomain, "js-domain", "", "the JetStream domain documents are stored in, which their signatures bind (a site's leaf node)")
	pf.IntVar(&g.replicas, "replicas", 1, "replicas of the streams and the checkpoint bucket (3 on a three-node cluster)")
	pf.StringVar(&g.httpAddr, "http-addr", "", "address to serve /metrics, /healthz and /readyz on (empty: none)")
	pf.StringVar(&g.logLevel, "log-level", "info", "log level: trace, debug, info, warn or error")
	pf.StringVar(&g.logFormat, "log-format", "", "log format: json or console (empty: console when stderr is a terminal, so an operator's audit lines read as lines beside a table, and json otherwise, as services and collectors want)")

	root.AddCommand(
		newWorkerCmd(g), newPublishCmd(g), newServeCmd(g), newExportCmd(g),
		newReplayCmd(g), newDLQCmd(g), newStatusCmd(g), newKeysCmd(g),
		newJoinCmd(g), newDevCmd(g), newBenchCmd(g), newSetupCmd(g), newCredsCmd(g), newTokenCmd(g), newSiteCmd(g),
	)
	root.AddCommand(newOpsCmds(g)...)
	return root
}

// setup checks the global flags and builds the logger. Logs go to stderr,
// so that what a command prints on stdout stays machine-readable.
func (g *globals) setup(stderr io.Writer) error {
	level, err := zerolog.ParseLevel(strings.ToLower(g.logLevel))
	if err != nil || g.logLevel == "" {
		return fmt.Errorf("--log-level %q: want trace, debug, info, warn or error", g.logLevel)
	}
	var out io.Writer
	format := g.logFormat
	if format == "" {
		format = "json"
		if isTerminal(stderr) {
			format = "console"
		}
	}
	switch format {
	case "json":
		out = stderr
	case "console":
		out = zerolog.ConsoleWriter{Out: stderr, TimeFormat: time.TimeOnly, NoColor: !isTerminal(stderr)}
	default:
		return fmt.Errorf("--log-format %q: want json or console", g.logFormat)
	}
	if g.replicas < 1 || g.replicas > 5 {
		return fmt.Errorf("--replicas %d: want 1 to 5 (JetStream keeps at most 5 copies)", g.replicas)
	}
	g.log = zerolog.New(out).Level(level).With().Timestamp().Logger()
	return nil
}

// isTerminal says whether w is a terminal, where colours help; in a file or
// a pipe they are noise.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// as is a copy of g that authenticates with the credentials file creds
// and no other way: steward dev connects each of its parts as its own
// identity.
func (g *globals) as(creds string) *globals {
	c := *g
	c.natsCreds, c.natsUser, c.natsPasswordFile, c.natsNkey, c.natsInbox = creds, "", "", "", ""
	return &c
}

// connect opens a NATS connection that reconnects forever once it is up.
// With wait it also retries the first connection until ctx ends, as a
// long-running service started before its NATS server should; without it a
// server that cannot be reached is an error at once.
func (g *globals) connect(ctx context.Context, name string, wait bool) (*nats.Conn, jetstream.JetStream, error) {
	if !wait && !g.urlGiven && g.contextName == "" && g.natsURL == nats.DefaultURL {
		// An operator's command tried against whatever listens on
		// 127.0.0.1:4222 has read or changed the wrong bus more than
		// once; a service (wait) keeps the documented default.
		return nil, nil, errors.New("no NATS server is configured: give --nats-url (STEWARD_NATS_URL) or --context (NATS_CONTEXT, a nats CLI context); steward dev prints both, and writes the context steward-dev-operator")
	}
	opts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				g.log.Warn().Err(err).Msg("NATS disconnected; reconnecting")
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			g.log.Info().Str("server", nc.ConnectedUrlRedacted()).Msg("NATS reconnected")
		}),
	}
	auth, err := g.authOptions()
	if err != nil {
		return nil, nil, err
	}
	opts = append(opts, auth...)
	var (
		nc *nats.Conn
		js jetstream.JetStream
	)
	dial := func() error {
		c, err := nats.Connect(g.natsURL, opts...)
		if err != nil {
			err = fmt.Errorf("connect to NATS at %s (--nats-url): %w", redactURL(g.natsURL), err)
			if isAuthError(err) {
				// Waiting does not fix credentials.
				return backoff.Permanent(fmt.Errorf("%w; %s", err, g.authHint()))
			}
			return err
		}
		j, err := g.jetStream(c)
		if err != nil {
			c.Close()
			return backoff.Permanent(err)
		}
		nc, js = c, j
		return nil
	}
	if !wait {
		return nc, js, dial()
	}
	if err := g.retry(ctx, "NATS is not reachable yet", dial); err != nil {
		return nil, nil, err
	}
	return nc, js, nil
}

// authOptions are the connection's credentials and inbox prefix. At most
// one way to authenticate is given; none is allowed (a bus without
// authorization, or a user in the URL) and the server decides.
func (g *globals) authOptions() ([]nats.Option, error) {
	ways := 0
	for _, set := range []bool{g.natsCreds != "", g.natsUser != "", g.natsNkey != ""} {
		if set {
			ways++
		}
	}
	if ways > 1 {
		return nil, errors.New("--nats-creds, --nats-user and --nats-nkey are three ways to authenticate; give one")
	}
	if (g.natsUser == "") != (g.natsPasswordFile == "") {
		return nil, errors.New("--nats-user and --nats-password-file go together; give both, or --nats-creds instead")
	}
	var opts []nats.Option
	inbox := g.natsInbox
	switch {
	case g.natsCreds != "":
		raw, err := os.ReadFile(g.natsCreds)
		if err != nil {
			return nil, fmt.Errorf("--nats-creds: %w", err)
		}
		if inbox == "" {
			inbox = natsauth.CredsInboxPrefix(raw)
		}
		opts = append(opts, nats.UserCredentials(g.natsCreds))
	case g.natsUser != "":
		raw, err := os.ReadFile(g.natsPasswordFile)
		if err != nil {
			return nil, fmt.Errorf("--nats-password-file: %w", err)
		}
		pass := strings.TrimRight(string(raw), "\r\n")
		if pass == "" {
			return nil, fmt.Errorf("--nats-password-file %s is empty; write the password of --nats-user %s into it", g.natsPasswordFile, g.natsUser)
		}
		opts = append(opts, nats.UserInfo(g.natsUser, pass))
	case g.natsNkey != "":
		o, err := nats.NkeyOptionFromSeed(g.natsNkey)
		if err != nil {
			// nats.go's error may quote the file; name the file only.
			return nil, fmt.Errorf("--nats-nkey %s holds no readable nkey seed", g.natsNkey)
		}
		opts = append(opts, o)
	}
	if inbox == "" && g.jsDomain != "" {
		// A hub-side tool reading a site: the site's answers cross its
		// link, whose leaf identity may answer under this prefix only,
		// never into another identity's inbox (internal/natsauth).
		inbox = events.SiteInboxPrefix(g.jsDomain)
	}
	if inbox != "" && inbox != "_INBOX" {
		opts = append(opts, nats.CustomInboxPrefix(inbox))
	}
	return opts, nil
}

// isAuthError says whether NATS refused the credentials (or their
// absence).
func isAuthError(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrAuthRevoked) ||
		strings.Contains(strings.ToLower(err.Error()), "authorization violation")
}

// authHint says what to do when the server refused the connection.
func (g *globals) authHint() string {
	switch {
	case g.natsCreds != "":
		return fmt.Sprintf("the server refused the credentials in --nats-creds %s: issue them again with `steward creds issue` from the account the server trusts", g.natsCreds)
	case g.natsUser != "":
		return fmt.Sprintf("the server refused user %s: check --nats-user and --nats-password-file", g.natsUser)
	case g.natsNkey != "":
		return fmt.Sprintf("the server refused the nkey in --nats-nkey %s", g.natsNkey)
	}
	return "the bus is closed and no credentials were given: set --nats-creds (STEWARD_NATS_CREDS) to a file from `steward creds issue`, or the one `steward dev` prints"
}

// retry runs fn until it succeeds, ctx ends or fn returns a
// backoff.Permanent error, waiting between tries with exponential backoff
// (500ms to 10s). Processes started beside a NATS server or a cluster that
// is still forming (compose, systemd) wait for it instead of exiting.
func (g *globals) retry(ctx context.Context, what string, fn func() error) error {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 500 * time.Millisecond
	b.MaxInterval = 10 * time.Second
	b.MaxElapsedTime = 0
	return backoff.RetryNotify(fn, backoff.WithContext(b, ctx), func(err error, next time.Duration) {
		g.log.Warn().Err(err).Dur("retry_in", next).Msg(what)
	})
}

// redactURL hides a password in a NATS URL before it is printed.
func redactURL(u string) string {
	parts := strings.Split(u, ",")
	for i, p := range parts {
		if scheme, rest, ok := strings.Cut(p, "://"); ok {
			if at := strings.LastIndex(rest, "@"); at >= 0 {
				parts[i] = scheme + "://***@" + rest[at+1:]
			}
		}
	}
	return strings.Join(parts, ",")
}

// newRegistry is a Prometheus registry with the Go and process collectors,
// so /metrics shows the process as well as the workers.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// serveHTTP serves h on addr until ctx ends. The listener is opened before
// it returns, so a busy port is an error now rather than a log line later.
func serveHTTP(ctx context.Context, log zerolog.Logger, addr string, h http.Handler) (bound string, stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Str("addr", addr).Msg("HTTP server stopped")
		}
	}()
	return ln.Addr().String(), func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-done
	}, nil
}

// jetStream is the JetStream API on c, in --js-domain's domain when one is
// set (a site's leaf node, or a context's jetstream_domain): the connected
// server's own when it is in that domain, as a worker at its site's leaf
// node is (events.JetStreamIn).
func (g *globals) jetStream(c *nats.Conn) (jetstream.JetStream, error) {
	return events.JetStreamIn(c, g.jsDomain)
}
