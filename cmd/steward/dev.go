package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/atomicfile"
	"github.com/steward-dev/steward/internal/gateway"
	"github.com/steward-dev/steward/internal/natsauth"
	"github.com/steward-dev/steward/internal/pgserver"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/internal/tokens"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/credential"
	"github.com/steward-dev/steward/workers/provision"
)

// tokenFile is where `steward dev` keeps its ingress token, under --dir.
const tokenFile = "ingress-token"

// devOptions are dev's own flags.
type devOptions struct {
	dir, natsListen, httpListen string
	// databaseURL, when set, is the provision worker's server instead of
	// dev's private cluster.
	databaseURL string
	// pgBin overrides where the private cluster's binaries are found.
	pgBin string
}

func newDevCmd(g *globals) *cobra.Command {
	var o devOptions
	rf := &runtimeFlags{}
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run everything on this machine with no set-up",
		Long: `Run Steward on one machine with no set-up: an embedded NATS server with
JetStream (on --nats-listen, never 4222, its store under <dir>/nats), the
streams, every worker with development keys and fixtures under --dir, and the
HTTP ingress with metrics, /healthz and /readyz on --http-listen. The ingress
token is made once and kept in <dir>/ingress-token (0600).

The provision worker gets a private PostgreSQL cluster under <dir>/postgres,
made with the machine's server binaries (--pg-bin, else pg_config --bindir,
else the newest /usr/lib/postgresql/*/bin) on a port of its own on 127.0.0.1,
run as the postgres user when dev runs as root, and stopped with dev. With
--database-url it uses that server instead and starts none. The machine's
shared server is never used unless --database-url names it. With neither
binaries nor --database-url, the other three workers run without it.

The bus is closed, as in production: the embedded NATS runs with JWT
authentication, trusting an operator and account dev makes once under
<dir>/nats-auth (seeds 0600). dev creates the streams and the bucket as the
operator, and each part connects as its own identity with credentials it
writes under <dir>/creds (0600): operator.creds, publisher.creds (the
ingress), and <worker>-<instance>.creds per worker. More can be issued with
steward creds issue --account-seed <dir>/nats-auth/signing.nk.

The NATS URL is printed on the first line, with the credentials to export
and the nats CLI line; then what runs and how to publish.
SIGINT or SIGTERM stops it gracefully. Everything it made stays in --dir and
is reused by the next run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// A person reads dev's log, so it defaults to the console form.
			if !cmd.Flags().Changed("log-format") {
				g.logFormat = "console"
				if err := g.setup(cmd.ErrOrStderr()); err != nil {
					return err
				}
			}
			return runDev(cmd.Context(), g, rf, cmd.OutOrStdout(), o)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.dir, "dir", ".steward", "folder for the NATS store, the private PostgreSQL, development keys and worker fixtures")
	fs.StringVar(&o.natsListen, "nats-listen", "127.0.0.1:4223", "address of the embedded NATS server (not 4222, so a real NATS there is left alone)")
	fs.StringVar(&o.httpListen, "http-listen", "127.0.0.1:8080", "address of the ingress, /metrics, /healthz and /readyz")
	fs.StringVar(&o.databaseURL, "database-url", "", "PostgreSQL connection string (a superuser) for the provision worker, instead of dev's private cluster (empty: the private cluster)")
	fs.StringVar(&o.pgBin, "pg-bin", "", "folder of PostgreSQL's server binaries for the private cluster (empty: pg_config --bindir, else the newest /usr/lib/postgresql/*/bin)")
	rf.add(fs)
	return cmd
}

func runDev(ctx context.Context, g *globals, rf *runtimeFlags, out io.Writer, o devOptions) error {
	dir := o.dir
	if err := os.MkdirAll(filepath.Join(dir, "nats"), 0o700); err != nil {
		return fmt.Errorf("--dir: %w", err)
	}
	// The bus is closed in dev too: the embedded server trusts dev's own
	// operator and account (kept under --dir, so the store's account
	// stays the same across runs), and every part of dev connects with
	// credentials scoped to its role.
	auth, err := natsauth.LoadOrCreate(filepath.Join(dir, devAuthDir))
	if err != nil {
		return err
	}
	creds := devCreds{dir: filepath.Join(dir, devCredsDir), auth: auth}
	if err := os.MkdirAll(creds.dir, 0o700); err != nil {
		return fmt.Errorf("--dir: %w", err)
	}
	operatorCreds, err := creds.write(natsauth.Operator())
	if err != nil {
		return err
	}
	publisherCreds, err := creds.write(natsauth.Publisher())
	if err != nil {
		return err
	}
	srv, err := startDevNATS(filepath.Join(dir, "nats"), o.natsListen, auth)
	if err != nil {
		return err
	}
	// PostgreSQL comes up (initdb takes a second the first time) while
	// the streams and the ingress do.
	pgDone := make(chan *devPostgres, 1)
	go func() { pgDone <- startDevPostgres(ctx, o) }()
	var pg *devPostgres
	defer func() {
		if pg == nil {
			pg = <-pgDone
		}
		// Deferred first, so it runs last: after the workers using it and
		// NATS have stopped.
		pg.stop(out)
	}()
	defer func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	}()
	url := srv.ClientURL()
	fmt.Fprintf(out, "NATS with JetStream: %s (store %s; closed: JWT authentication, credentials in %s)\n", url, filepath.Join(dir, "nats"), creds.dir)
	fmt.Fprintf(out, "  export STEWARD_NATS_URL=%s STEWARD_NATS_CREDS=%s   # for the steward commands below, as the operator\n", url, operatorCreds)
	fmt.Fprintf(out, "  nats --server %s --creds %s stream ls   # the nats CLI, as the operator\n", url, operatorCreds)
	fmt.Fprintf(out, "  publishers: %s (publishes steward.events.> only); each worker instance: %s\n", publisherCreds, filepath.Join(creds.dir, "<worker>-<instance>.creds"))
	// Contexts the nats CLI and steward both read, so an operator names
	// the server and credentials once (never over a context dev did not
	// write).
	for _, c := range []struct{ name, creds string }{{"steward-dev-operator", operatorCreds}, {"steward-dev-publisher", publisherCreds}} {
		wrote, err := writeDevContext(c.name, srv.ClientURL(), c.creds, dir)
		switch {
		case err != nil:
			g.log.Warn().Err(err).Str("context", c.name).Msg("the nats context was not written")
		case !wrote:
			fmt.Fprintf(out, "  (a nats context %s exists that dev did not write: kept, so the --context lines below use it)\n", c.name)
		}
	}
	fmt.Fprintf(out, "  steward --context steward-dev-operator status   # or: nats --context steward-dev-operator stream ls\n")

	g.natsURL = url
	// Setup is the operator's: dev creates the streams and the bucket
	// with the operator's credentials, as compose's setup service does.
	opG := g.as(operatorCreds)
	nc, js, err := opG.connect(ctx, "steward dev setup", false)
	if err != nil {
		return err
	}
	defer nc.Close()
	if err := workers.SetupBus(ctx, js, workers.DefaultBusConfig(g.replicas)); err != nil {
		return err
	}
	if _, err := recordUpgrade(ctx, opG, js); err != nil {
		return err
	}
	fmt.Fprintf(out, "streams: %s, %s, %s; bucket %s (made by dev as the operator; workers may not)\n", events.StreamEvents, events.StreamOutcomes, events.StreamDLQ, workers.CheckpointBucket)

	token, err := devToken(filepath.Join(dir, tokenFile))
	if err != nil {
		return err
	}
	// dev's controller key signs what its ingress and console publish and
	// what its printed lines publish; its credential and provision workers
	// verify with the public half.
	controllerKey, _, err := signing.DevControllerKey(dir)
	if err != nil {
		return err
	}
	signer, err := loadSigner(controllerKey)
	if err != nil {
		return err
	}
	// The ingress is a publisher.
	pubNC, pubJS, err := g.as(publisherCreds).connect(ctx, "steward dev ingress", false)
	if err != nil {
		return err
	}
	defer pubNC.Close()
	reg := newRegistry()
	var running []*workers.Runtime
	var mu sync.Mutex
	ready := func() error {
		if !pubNC.IsConnected() {
			return fmt.Errorf("NATS is %s", pubNC.Status())
		}
		mu.Lock()
		defer mu.Unlock()
		for _, w := range running {
			if err := w.Ready(); err != nil {
				return err
			}
		}
		return nil
	}
	tokensDir := filepath.Join(dir, "tokens")
	scoped, err := devScopedToken(opG, dir, tokensDir)
	if err != nil {
		return err
	}
	cfg, err := gatewayConfig(g.as(publisherCreds), pubNC, pubJS, reg, ingressOptions{token: token, tokensDir: tokensDir, signer: signer}, ready)
	if err != nil {
		return err
	}
	// The console reads what operators read, so it uses the operator's
	// connection; the ingress stays a publisher.
	cfg.ConsoleJS = js
	if cfg.ConsoleDocs, err = opG.documents(ctx, js); err != nil {
		opG.log.Warn().Err(err).Msg("the console cannot read the checkpoint bucket with these credentials; status documents are not shown verified, and stream readers cannot be paused from it")
	}
	gw, err := gateway.New(cfg)
	if err != nil {
		return err
	}
	bound, stopHTTP, err := serveHTTP(ctx, g.log, o.httpListen, gw)
	if err != nil {
		return fmt.Errorf("--http-listen: %w", err)
	}
	defer stopHTTP()
	base := "http://" + bound
	fmt.Fprintf(out, "console: %s/  (log in with the token; with the scoped token in %s to publish %s's rotations and %s's grants)\n", base, filepath.Join(dir, devScopedTokenFile), credential.DevHive, provision.DevMachine)
	_ = scoped
	fmt.Fprintf(out, "ingress: POST %s%s  (bearer token %s, kept in %s)\n", base, publisher.IngressPath, token, filepath.Join(dir, tokenFile))
	fmt.Fprintf(out, "metrics and health: %s/metrics  %s/healthz  %s/readyz\n", base, base, base)
	pg = <-pgDone
	for _, l := range pg.lines {
		fmt.Fprintln(out, l)
	}

	runCtx, stopWorkers := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWorkers()
	var wg sync.WaitGroup
	var conns []*nats.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for _, k := range kinds {
		h, lines, err := devHandler(ctx, k, dir, pg)
		var w *workers.Runtime
		if err == nil {
			// Each worker instance connects as itself.
			var wnc *nats.Conn
			wnc, w, err = creds.startWorker(ctx, g, rf, reg, h)
			if wnc != nil {
				conns = append(conns, wnc)
			}
		}
		if err != nil {
			// provision's reasons say "provision is not running" themselves.
			fmt.Fprintf(out, "%s is not running: %s\n", k.name, strings.TrimPrefix(oneLine(err), k.name+" is not running: "))
			if h != nil {
				h.Close()
			}
			continue
		}
		spec := h.Spec()
		fmt.Fprintf(out, "%s is running: consumer %s on %s\n", k.name, w.ConsumerName(), strings.Join(spec.Subjects, ", "))
		for _, l := range lines {
			fmt.Fprintf(out, "  %s\n", l)
		}
		mu.Lock()
		running = append(running, w)
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer h.Close()
			if err := w.Run(runCtx); err != nil {
				g.log.Error().Err(err).Str("worker", k.name).Msg("worker stopped")
			}
		}()
	}
	printHowToPublish(out, url, base, token, publisherCreds)
	fmt.Fprintln(out, "steward dev is running; Ctrl-C stops it")

	<-ctx.Done()
	fmt.Fprintln(out, "stopping: workers finish what they hold, then the ingress, NATS and PostgreSQL stop")
	stopWorkers()
	wg.Wait()
	for _, c := range append([]*nats.Conn{pubNC, nc}, conns...) {
		if err := c.FlushTimeout(5 * time.Second); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			g.log.Warn().Err(err).Msg("NATS flush at shutdown")
		}
	}
	return nil
}

// Where dev keeps its NATS authority (seeds and JWTs) and the credentials
// it issues from it, under --dir.
const (
	devAuthDir  = "nats-auth"
	devCredsDir = "creds"
)

// devCreds issues dev's credentials files, one per identity.
type devCreds struct {
	dir  string
	auth *natsauth.Authority
}

// write issues id's credentials into <dir>/<name>.creds (0600,
// atomically) and returns the path. They are issued anew each run: a
// user key costs nothing, and old files never outlive a --dir.
func (c devCreds) write(id natsauth.Identity) (string, error) {
	path := filepath.Join(c.dir, id.Name()+".creds")
	if err := c.auth.WriteCreds(path, id); err != nil {
		return "", err
	}
	return path, nil
}

// startWorker connects as h's instance, with credentials scoped to it, and
// makes its runtime.
func (c devCreds) startWorker(ctx context.Context, g *globals, rf *runtimeFlags, reg *prometheus.Registry, h handler) (*nats.Conn, *workers.Runtime, error) {
	spec := h.Spec()
	id, err := natsauth.Worker(spec.Name, spec.Instance)
	if err != nil {
		return nil, nil, err
	}
	path, err := c.write(id)
	if err != nil {
		return nil, nil, err
	}
	gw := g.as(path)
	nc, js, err := gw.connect(ctx, "steward dev "+id.Name(), false)
	if err != nil {
		return nil, nil, err
	}
	signer, verifier, err := gw.documentKeys(id.Name())
	if err != nil {
		return nc, nil, err
	}
	w, err := workers.New(ctx, js, spec, h, append(rf.options(g, reg), workers.WithDocumentKeys(signer, verifier))...)
	if err != nil {
		return nc, nil, err
	}
	return nc, w, nil
}

// devPostgres is the provision worker's PostgreSQL in dev: a private
// cluster dev runs, a server --database-url names, or none.
type devPostgres struct {
	// url is the server's connection string for provision; "" when there
	// is none, and then why says so.
	url string
	why error
	// lines say where PostgreSQL runs, for dev to print.
	lines []string
	// srv is the private cluster, stopped with dev; nil otherwise.
	srv *pgserver.Server
}

// startDevPostgres finds provision's PostgreSQL: --database-url when given
// (dev starts none), else a private cluster under <dir>/postgres from the
// machine's server binaries. It never falls back to the libpq defaults,
// which name the machine's shared server, whose roles and databases the
// test suite and other programs own.
func startDevPostgres(ctx context.Context, o devOptions) *devPostgres {
	if o.databaseURL != "" {
		return &devPostgres{url: o.databaseURL, lines: []string{
			fmt.Sprintf("PostgreSQL: %s, from --database-url (dev starts none of its own)", describeDatabaseURL(o.databaseURL)),
		}}
	}
	none := func(err error) *devPostgres {
		return &devPostgres{why: err, lines: []string{"PostgreSQL: none; " + oneLine(err)}}
	}
	bin, err := pgserver.FindBin(o.pgBin)
	if err != nil {
		if o.pgBin != "" {
			return none(fmt.Errorf("--pg-bin %w; point it at PostgreSQL's server bin folder, or give --database-url", err))
		}
		return none(fmt.Errorf("%w; install them (apt-get install postgresql), point --pg-bin at them, or give --database-url", err))
	}
	if os.Geteuid() == 0 {
		// The cluster runs as the postgres user, which must pass through
		// --dir (made 0700) to reach <dir>/postgres; o+x lets it through
		// without letting it list or read anything else kept there.
		if fi, err := os.Stat(o.dir); err == nil && fi.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(o.dir, fi.Mode().Perm()|0o001); err != nil {
				return none(fmt.Errorf("let the postgres user through --dir %s: %w; give a --dir it can enter, or --database-url", o.dir, err))
			}
		}
	}
	began := time.Now()
	srv, err := pgserver.Start(ctx, pgserver.Options{Bin: bin, Dir: filepath.Join(o.dir, "postgres")})
	if err != nil {
		return none(fmt.Errorf("the private PostgreSQL did not start: %w; fix that, or give --database-url", err))
	}
	state := "reused"
	if srv.Initialised {
		state = "made now"
	}
	if srv.Recovered != "" {
		state += "; " + srv.Recovered
	}
	lines := []string{
		fmt.Sprintf("PostgreSQL: 127.0.0.1:%d, a private cluster in %s (%s, up in %s), run as the %s user from %s; stopped with dev",
			srv.Port, srv.Dir, state, time.Since(began).Round(time.Millisecond), srv.User, srv.Bin),
		fmt.Sprintf("  its superuser: psql \"host=127.0.0.1 port=%d user=%s dbname=postgres\"   (log %s)", srv.Port, pgserver.Superuser, srv.LogFile),
	}
	return &devPostgres{url: srv.URL("postgres"), srv: srv, lines: lines}
}

// stop stops the private cluster, if dev runs one.
func (p *devPostgres) stop(out io.Writer) {
	if p.srv == nil {
		return
	}
	if err := p.srv.Stop(); err != nil {
		fmt.Fprintf(out, "PostgreSQL did not stop: %s\n", oneLine(err))
		return
	}
	fmt.Fprintf(out, "PostgreSQL stopped (cluster kept in %s)\n", p.srv.Dir)
}

// describeDatabaseURL names a server for printing, never its password.
func describeDatabaseURL(u string) string {
	cc, err := pgx.ParseConfig(u)
	if err != nil {
		return "a --database-url that does not parse"
	}
	return fmt.Sprintf("%s:%d as %s, database %s", cc.Host, cc.Port, cc.User, cc.Database)
}

// devHandler builds a worker's development instance; provision's runs
// against the PostgreSQL dev found, or not at all.
func devHandler(ctx context.Context, k kind, dir string, pg *devPostgres) (handler, []string, error) {
	if k.name != provision.Name {
		return k.dev(ctx, dir)
	}
	if pg.url == "" {
		return nil, nil, fmt.Errorf("it needs PostgreSQL: %s; grant events wait in the stream until it runs", oneLine(pg.why))
	}
	cfg, lines, err := provision.DevAt(ctx, dir, pg.url)
	if err != nil {
		return nil, nil, err
	}
	w, err := provision.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	return w, lines, nil
}

// startDevNATS starts the embedded server. It refuses 4222, the port of a
// NATS an operator may already run, whose streams dev must not touch.
func startDevNATS(store, listen string, auth *natsauth.Authority) (*server.Server, error) {
	host, portText, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("--nats-listen %q is not host:port: %w", listen, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("--nats-listen %q: the port is not a number from 0 to 65535", listen)
	}
	if port == 4222 {
		return nil, errors.New("--nats-listen: dev does not take 4222, the port of a real NATS server; use another (default 4223)")
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	// Checked first: the server reports a busy port only in its log.
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("--nats-listen %s: %w (is another steward dev running? give another --nats-listen)", listen, err)
	}
	ln.Close()
	opts := &server.Options{
		ServerName: "steward-dev",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   store,
		NoLog:      true,
		NoSigs:     true,
	}
	if err := auth.Configure(opts); err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(15 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("embedded NATS on %s did not become ready in 15s (store %s)", listen, store)
	}
	return srv, nil
}

// devToken returns the ingress token kept at path, making it on first use.
func devToken(path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err == nil {
		if tok := strings.TrimSpace(string(raw)); tok != "" {
			return tok, nil
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("ingress token: %w", err)
	}
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	tok := hex.EncodeToString(b)
	if err := atomicfile.Write(path, []byte(tok+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("ingress token: %w", err)
	}
	return tok, nil
}

// devScopedTokenFile is where dev keeps the secret of its scoped token, the
// one the console and the ingress sign its hive's rotations and its
// machine's grants for.
const devScopedTokenFile = "scoped-token"

// devScopedToken issues (once) the scoped token "dev" into tokensDir,
// signed with the operator's document key, for dev's own hive and machine
// with a window of 1000, and returns its secret. The ingress token stays
// unscoped and never has anything signed.
func devScopedToken(opG *globals, dir, tokensDir string) (string, error) {
	const name = "dev"
	secretPath := filepath.Join(dir, devScopedTokenFile)
	if err := os.MkdirAll(tokensDir, 0o700); err != nil {
		return "", fmt.Errorf("tokens folder: %w", err)
	}
	if raw, err := os.ReadFile(secretPath); err == nil {
		if _, err := os.Stat(tokens.PathOf(tokensDir, name)); err == nil {
			return strings.TrimSpace(string(raw)), nil
		}
	}
	signer, _, err := opG.documentKeys(events.OperatorWriter)
	if err != nil {
		return "", err
	}
	if signer == nil {
		// Operator credentials from before document keys: dev runs, and
		// its ingress and console sign nothing until they are issued again.
		return "", nil
	}
	secret := tokens.NewSecret()
	sealed, err := tokens.Seal(signer, tokens.Document{V: 1, Name: name, TokenSHA256: tokens.HashSecret(secret),
		Types: []string{events.TypeCredentialRotated, events.TypeGrantChanged}, Keys: []string{credential.DevHive, provision.DevMachine},
		Window: 1000, IssuedAt: time.Now().UTC().Format(time.RFC3339)})
	if err != nil {
		return "", err
	}
	if err := atomicfile.Write(secretPath, []byte(secret+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("scoped token: %w", err)
	}
	if err := tokens.Write(tokensDir, name, sealed); err != nil {
		return "", err
	}
	return secret, nil
}

func printHowToPublish(out io.Writer, natsURL, base, token, publisherCreds string) {
	typ := events.TypeReleasePublished
	fmt.Fprintf(out, `
how to publish an event (here a release; any program that sets NATS headers can):
  go run ./cmd/steward publish --nats-url %[1]s --nats-creds %[6]s --type %[2]s --data '{"version":"1.2.3"}'
  nats --server %[1]s --creds %[6]s pub steward.events.release.published --header ce-specversion:1.0 --header ce-type:%[2]s --header ce-source:/cli --header ce-id:rel-1.2.3 --header ce-subject:1.2.3 --header content-type:application/json '{"version":"1.2.3"}'
  curl -H 'Authorization: Bearer %[4]s' -H 'ce-specversion: 1.0' -H 'ce-type: %[2]s' -H 'ce-source: /cli' -H 'ce-id: rel-1.2.3' -H 'ce-subject: 1.2.3' -H 'content-type: application/json' -d '{"version":"1.2.3"}' %[3]s%[5]s
then look: go run ./cmd/steward --context steward-dev-operator status  |  go run ./cmd/steward --context steward-dev-operator dlq ls
`, natsURL, typ, base, token, publisher.IngressPath, publisherCreds)
}

// oneLine keeps a multi-line reason on one printed line.
func oneLine(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }
