package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/devstack"
	"github.com/steward-dev/steward/internal/gateway"
	"github.com/steward-dev/steward/internal/pgserver"
	"github.com/steward-dev/steward/internal/proof"
	"github.com/steward-dev/steward/internal/resident"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/credential"
	"github.com/steward-dev/steward/workers/provision"
)

// devOptions are dev's own flags.
type devOptions struct {
	dir, natsListen, httpListen string
	// databaseURL, when set, is the provision worker's server instead of
	// dev's private cluster.
	databaseURL string
	// pgBin overrides where the private cluster's binaries are found.
	pgBin string
	// traceURL links the console's trace ids to a trace UI.
	traceURL string
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

The NATS URL is printed on the first line, with the credentials to export,
the nats CLI line and the nats contexts dev saved (steward-dev-operator,
steward-dev-publisher); then what runs and how to publish. Every printed
command carries its credentials (a context, a credentials file or the
token), and the releases they publish are signed in dev's registry above the
version the converge install is at, which dev reads from the bucket at
every start.
SIGINT or SIGTERM stops it gracefully. Everything it made stays in --dir and
is reused by the next run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := gateway.CheckTraceURL(o.traceURL); err != nil {
				return err
			}
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
	fs.StringVar(&o.traceURL, "trace-url", "", "link the console's trace ids to a trace UI: an http(s) address with {traceId} where the id goes, e.g. http://127.0.0.1:16686/trace/{traceId}")
	rf.add(fs)
	return cmd
}

func runDev(ctx context.Context, g *globals, rf *runtimeFlags, out io.Writer, o devOptions) error {
	var devWorkers []devstack.Worker
	for _, k := range kinds {
		devWorkers = append(devWorkers, devstack.Worker{Name: k.name, Dev: func(ctx context.Context, dir string) (devstack.Service, []string, error) {
			return k.dev(ctx, dir)
		}})
	}
	reg := newRegistry()
	stack := devstack.New(o.dir, devIdentity{g},
		devstack.WithNATSListen(o.natsListen), devstack.WithHTTPListen(o.httpListen),
		devstack.WithDatabaseURL(o.databaseURL), devstack.WithPGBin(o.pgBin), devstack.WithTraceURL(o.traceURL),
		devstack.WithReplicas(g.replicas), devstack.WithLogger(g.log), devstack.WithRegistry(reg),
		devstack.WithWorkers(devWorkers...),
		devstack.WithWorkerOptions(func(r prometheus.Registerer) []workers.Option { return rf.options(g, r) }))
	defer func() {
		err := stack.Stop()
		printStopped(out, stack.Postgres, err)
	}()
	if err := stack.Start(ctx); err != nil {
		return err
	}
	printDev(out, g, stack)
	// What start-up allocated and dropped (a first start's release key
	// sealed with scrypt, 64 MiB; the packages' set-up) raised the heap's
	// goal, so an idle dev would see no collection for minutes and keep
	// it resident, as it would the binary's pages only init ran: hand
	// both back now.
	if err := resident.Trim(); err != nil {
		g.log.Debug().Err(err).Msg("start-up pages left resident")
	}
	<-ctx.Done()
	fmt.Fprintln(out, "stopping: workers finish what they hold, then the ingress, NATS and PostgreSQL stop")
	return nil
}

// devIdentity connects dev's parts as the credentials dev issued them, the
// way every command connects (--nats-inbox-prefix, --document-trust and
// the rest hold for them too).
type devIdentity struct{ g *globals }

func (d devIdentity) Connect(ctx context.Context, name, url, creds string) (*nats.Conn, jetstream.JetStream, error) {
	c := d.g.as(creds)
	c.natsURL = url
	return c.connect(ctx, name, false)
}

func (d devIdentity) DocumentKeys(creds, by string) (*proof.Signer, *proof.Verifier, error) {
	return d.g.as(creds).documentKeys(by)
}

// printDev says what runs and how to use it; the NATS URL is on the first
// line.
func printDev(out io.Writer, g *globals, s *devstack.Stack) {
	url := s.URL()
	fmt.Fprintf(out, "NATS with JetStream: %s (store %s; closed: JWT authentication, credentials in %s)\n", url, s.StoreDir(), s.CredsDir)
	fmt.Fprintf(out, "  export STEWARD_NATS_URL=%s STEWARD_NATS_CREDS=%s   # for steward commands of your own, as the operator\n", url, s.OperatorCreds)
	fmt.Fprintf(out, "  nats --server %s --creds %s stream ls   # the nats CLI, as the operator\n", url, s.OperatorCreds)
	fmt.Fprintf(out, "  publishers: %s (publishes steward.events.> only); each worker instance: %s\n", s.PublisherCreds, filepath.Join(s.CredsDir, "<worker>-<instance>.creds"))
	// Contexts the nats CLI and steward both read, so an operator names
	// the server and credentials once (never over a context dev did not
	// write).
	for _, c := range []struct{ name, creds string }{{devOperatorContext, s.OperatorCreds}, {devPublisherContext, s.PublisherCreds}} {
		wrote, err := writeDevContext(c.name, url, c.creds, s.Dir)
		switch {
		case err != nil:
			g.log.Warn().Err(err).Str("context", c.name).Msg("the nats context was not written")
		case !wrote:
			fmt.Fprintf(out, "  (a nats context %s exists that dev did not write: kept, so the --context lines below use it)\n", c.name)
		}
	}
	fmt.Fprintf(out, "  nats --context %s stream ls   # the same through the nats contexts dev wrote, %s and %s, which steward --context reads too\n", devOperatorContext, devOperatorContext, devPublisherContext)
	fmt.Fprintf(out, "streams: %s, %s, %s; bucket %s (made by dev as the operator; workers may not)\n", events.StreamEvents, events.StreamOutcomes, events.StreamDLQ, events.CheckpointBucket)
	base := "http://" + s.HTTP
	fmt.Fprintf(out, "console: %s/  (log in with the token; with the scoped token in %s to publish %s's rotations and %s's grants)\n", base, s.ScopedTokenFile, credential.DevHive, provision.DevMachine)
	fmt.Fprintf(out, "ingress: POST %s%s  (bearer token %s, kept in %s)\n", base, publisher.IngressPath, s.Token, s.TokenFile)
	fmt.Fprintf(out, "metrics and health: %s/metrics  %s/healthz  %s/readyz\n", base, base, base)
	printPostgres(out, s.Postgres)
	for _, w := range s.Workers {
		if w.Err != nil {
			// provision's reasons say "provision is not running" themselves.
			fmt.Fprintf(out, "%s is not running: %s\n", w.Name, strings.TrimPrefix(oneLine(w.Err), w.Name+" is not running: "))
			continue
		}
		fmt.Fprintf(out, "%s is running: consumer %s on %s\n", w.Name, w.Runtime.ConsumerName(), strings.Join(w.Spec.Subjects, ", "))
		for _, l := range w.Lines {
			fmt.Fprintf(out, "  %s\n", withPublisherContext(l))
		}
	}
	printHowToPublish(out, url, base, s.Token, s.PublisherCreds, s.Converge.Next()[2:5])
	fmt.Fprintln(out, "steward dev is running; Ctrl-C stops it")
}

// printPostgres says where the provision worker's PostgreSQL runs.
func printPostgres(out io.Writer, pg *devstack.Postgres) {
	switch {
	case pg.Given:
		fmt.Fprintf(out, "PostgreSQL: %s, from --database-url (dev starts none of its own)\n", describeDatabaseURL(pg.URL))
	case pg.Server == nil:
		fmt.Fprintf(out, "PostgreSQL: none; %s\n", oneLine(pg.Why))
	default:
		srv := pg.Server
		fmt.Fprintf(out, "PostgreSQL: 127.0.0.1:%d, a private cluster in %s (%s, up in %s), run as the %s user from %s; stopped with dev\n",
			srv.Port, srv.Dir, pg.State, pg.Took.Round(time.Millisecond), srv.User, srv.Bin)
		fmt.Fprintf(out, "  its superuser: psql \"host=127.0.0.1 port=%d user=%s dbname=postgres\"   # its log: %s\n", srv.Port, pgserver.Superuser, srv.LogFile)
	}
}

// printStopped says whether dev's private PostgreSQL stopped (err is why
// not).
func printStopped(out io.Writer, pg *devstack.Postgres, err error) {
	switch {
	case pg == nil || pg.Server == nil:
	case err != nil:
		fmt.Fprintf(out, "PostgreSQL did not stop: %s\n", oneLine(err))
	default:
		fmt.Fprintf(out, "PostgreSQL stopped (cluster kept in %s)\n", pg.Server.Dir)
	}
}

// describeDatabaseURL names a server for printing, never its password.
func describeDatabaseURL(u string) string {
	cc, err := pgx.ParseConfig(u)
	if err != nil {
		return "a --database-url that does not parse"
	}
	return fmt.Sprintf("%s:%d as %s, database %s", cc.Host, cc.Port, cc.User, cc.Database)
}

// The nats contexts dev writes for its operator and its publishers; the
// commands it prints name them, so each works pasted on its own.
const (
	devOperatorContext  = "steward-dev-operator"
	devPublisherContext = "steward-dev-publisher"
)

// withPublisherContext makes a worker's publish line carry the publishers'
// context: a worker's lines name no server, since its package does not
// know dev's.
func withPublisherContext(line string) string {
	return strings.ReplaceAll(line, "go run ./cmd/steward publish", "go run ./cmd/steward --context "+devPublisherContext+" publish")
}

// printHowToPublish prints three ways to publish a release, one for each
// of versions (three releases dev's registry holds above the converge
// lines' two, so each applies in turn).
func printHowToPublish(out io.Writer, natsURL, base, token, publisherCreds string, versions []string) {
	typ := events.TypeReleasePublished
	fmt.Fprintf(out, `
how to publish an event, three ways (here the releases %[7]s, %[8]s and %[9]s, in turn; any program that sets NATS headers can):
  go run ./cmd/steward publish --nats-url %[1]s --nats-creds %[6]s --type %[2]s --data '{"version":"%[7]s"}'
  nats --server %[1]s --creds %[6]s pub steward.events.release.published --header ce-specversion:1.0 --header ce-type:%[2]s --header ce-source:/cli --header ce-id:rel-%[8]s --header ce-subject:%[8]s --header content-type:application/json '{"version":"%[8]s"}'
  curl --fail-with-body -H 'Authorization: Bearer %[4]s' -H 'ce-specversion: 1.0' -H 'ce-type: %[2]s' -H 'ce-source: /cli' -H 'ce-id: rel-%[9]s' -H 'ce-subject: %[9]s' -H 'content-type: application/json' -d '{"version":"%[9]s"}' %[3]s%[5]s
then look:
  go run ./cmd/steward --context %[10]s status
  go run ./cmd/steward --context %[10]s dlq ls
`, natsURL, typ, base, token, publisher.IngressPath, publisherCreds, versions[0], versions[1], versions[2], devOperatorContext)
}

// oneLine keeps a multi-line reason on one printed line.
func oneLine(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }
