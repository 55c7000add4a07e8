package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/atomicfile"
	"github.com/steward-dev/steward/internal/leafnode"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/internal/signing"
)

// siteSetupTimeout bounds `steward site setup`: a site whose leaf node is
// not linked answers nothing, and the operator is told so rather than left
// waiting.
const siteSetupTimeout = time.Minute

// newSiteCmd is a site's topology (docs/design.md §9): the leaf node's
// configuration, and its streams set up from the hub.
func newSiteCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "site",
		Short: "A site's NATS leaf node and streams: configuration and set-up (an operator's commands)",
		Long: `A site is a NATS leaf node with its own JetStream domain (the site's name),
linked to the hub. Its STEWARD_EVENTS sources the hub's, filtered to the site's
keys and the subjects every site needs (release.published, hostfloor.published),
and listens on nothing itself; its workers checkpoint and write outcomes and
dead letters at the site, and the hub's STEWARD_OUTCOMES and STEWARD_DLQ source
each site's. The link carries none of Steward's subjects, only JetStream's.

  site config NAME   writes the leaf node's nats-server configuration
  site setup NAME    creates or updates the site's streams and bucket, from the hub
  site status        at the hub: each site's link, and how many events it is behind and since when
  site keep          at the hub: restarts the hub's sources of a linked site's outcomes that stalled

Workers at a site run unchanged, pointed at the leaf node with --js-domain NAME.`,
	}
	cmd.AddCommand(newSiteConfigCmd(), newSiteSetupCmd(g), newSiteStatusCmd(g), newSiteKeepCmd(g))
	return cmd
}

func newSiteConfigCmd() *cobra.Command {
	var (
		c   leafnode.Config
		out string
	)
	cmd := &cobra.Command{
		Use:   "config NAME",
		Short: "Write the site's leaf node configuration (nats-server -c FILE)",
		Long: `Write the nats-server configuration of site NAME's leaf node: a persistent
server name, its own store, JetStream in domain NAME, and the link to the hub's
leaf node port (--hub-url) with the leaf's credentials (--leaf-creds), carrying
none of Steward's subjects. With --server-dir and --account the leaf runs the
closed bus as the hub does, and --leaf-creds are the site's leaf identity
(steward creds issue leaf NAME), whose permissions let the link carry this
site's sourcing and nothing of another site's. The hub runs JetStream in its
own domain (jetstream { domain: hub }), listens for leaf nodes
(leafnodes { port: 7422 }), and runs with feature_flags { js_api_reply_v2: true }
(nats-server 2.15), as the leaf does.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c.Site = args[0]
			if err := c.Check(); err != nil {
				return fmt.Errorf("steward site config: %w", err)
			}
			body := c.Render()
			if out == "" || out == "-" {
				_, err := cmd.OutOrStdout().Write(body)
				return err
			}
			if err := atomicfile.Write(out, body, 0o644); err != nil {
				return fmt.Errorf("steward site config: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: leaf node of site %s, JetStream domain %s, linked to %s\n", out, c.Site, c.Site, redactURL(c.HubURL))
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&c.HubURL, "hub-url", "", "the hub's leaf node URL, nats-leaf://HOST:7422 (or tls://HOST:7422)")
	fs.StringVar(&c.LeafCreds, "leaf-creds", "", "credentials file the leaf connects to the hub with")
	fs.StringVar(&c.Listen, "listen", "127.0.0.1:4222", "where the site's workers connect")
	fs.StringVar(&c.HTTPListen, "http-listen", "", "the leaf node's monitoring address (/healthz, /leafz); empty: none")
	fs.StringVar(&c.Store, "store-dir", "", "the leaf node's JetStream store, its own")
	fs.StringVar(&c.MaxFileStore, "max-file-store", "32GB", "the store's size: the site's streams and bucket reserve their max bytes")
	fs.StringVar(&c.ServerDir, "server-dir", "", "the operator and account JWTs (steward creds init --server-dir): the leaf runs the closed bus")
	fs.StringVar(&c.Account, "account", "", "with --server-dir: the STEWARD account's public key (account.pub), the link's local account")
	fs.StringVarP(&out, "out", "o", "", "file to write (empty or -: standard output)")
	return cmd
}

func newSiteSetupCmd(g *globals) *cobra.Command {
	var (
		site                         events.Site
		keysFile, siteURL            string
		controllerKeys               string
		cfg                          = events.DefaultBusConfig(1)
		maxBytes, dlqMax, cpMaxBytes int64
	)
	cmd := &cobra.Command{
		Use:   "setup NAME",
		Short: "Create or update site NAME's streams and bucket, and the hub's sources of its outcomes",
		Long: `Run as the operator against the hub (--nats-url, --nats-creds): in site NAME's
domain, create or update STEWARD_EVENTS sourcing the hub's through the hub's
durable consumer site-NAME (created here), filtered to the site's keys and the
subjects every site needs, with no subjects of its own; STEWARD_OUTCOMES, STEWARD_DLQ and the
checkpoint bucket; and at the hub add the site's outcomes and dead letters as
sources of its STEWARD_OUTCOMES and STEWARD_DLQ. The site's leaf node must be
linked. Run it again to change the site's keys: the filters are replaced, and a
key added receives the events published from then on. The hub's consumer's
pending count is how far behind the site is.

--site-url is the site's leaf node (its client port): the site's streams,
bucket and its consumers for the hub are made there, with the same operator
credentials. On the closed bus it is required: the site's leaf identity lets
the hub only read a site's JetStream, never change it, so that no answer
reflected at the hub becomes a change at a site (docs/design.md §7).

The site's keys come from its membership, which the controller signs: the
newest site.membership event for NAME in the hub's STEWARD_EVENTS (published
with steward publish --signing-key), verified with --controller-key. It is
refused, and nothing changed, when it does not verify, when it names another
site, when a key of it is in another site's newest membership (a key belongs
to one site: publish the other site's membership without it first), or when
its generation is below the one the site's filters were set up from (the
hub's consumer records it; the same generation again is a no-op re-run).

--boxes, --hives, --machines and --keys-file are the unsigned way, for an
open bus or a first set-up: whoever runs the command decides the site's keys,
and nothing stops two sites from claiming one. --keys-file holds one key a
line, "box NAME", "hive NAME" or "machine NAME"; '#' starts a comment.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			site.Name = args[0]
			fromMembership := keysFile == "" && !cmd.Flags().Changed("boxes") && !cmd.Flags().Changed("hives") && !cmd.Flags().Changed("machines")
			var keys *signing.KeySet
			if fromMembership {
				// The name is checked first: no membership makes a bad
				// name good.
				if err := (events.Site{Name: site.Name, HubDomain: site.HubDomain}).Check(); err != nil {
					return fmt.Errorf("steward site setup: %w", err)
				}
				if controllerKeys == "" {
					return fmt.Errorf("steward site setup: site %s: no keys given (--boxes, --hives, --machines, --keys-file), so they come from the site's signed membership, and --controller-key (STEWARD_CONTROLLER_KEY) is required to verify it; nothing was changed", site.Name)
				}
				var err error
				if keys, err = signing.LoadEnvelopeKeys(controllerKeys); err != nil {
					return fmt.Errorf("steward site setup: --controller-key: %w", err)
				}
			}
			if keysFile != "" {
				if err := readSiteKeys(keysFile, &site); err != nil {
					return fmt.Errorf("steward site setup: %w", err)
				}
			}
			if err := site.Check(); err != nil {
				return fmt.Errorf("steward site setup: %w", err)
			}
			cfg.Streams.Replicas = g.replicas
			cfg.Streams.MaxBytes, cfg.Streams.DLQMaxBytes, cfg.CheckpointMaxBytes = maxBytes, dlqMax, cpMaxBytes
			ctx := cmd.Context()
			nc, hubJS, err := g.connect(ctx, "steward site setup", false)
			if err != nil {
				return err
			}
			defer nc.Close()
			if fromMembership {
				hubDomain := site.HubDomain
				if site, err = ops.MembershipSite(ctx, hubJS, keys, site.Name, hubDomain); err != nil {
					return fmt.Errorf("steward site setup: %w", err)
				}
				if err := site.Check(); err != nil {
					return fmt.Errorf("steward site setup: %w", err)
				}
			}
			siteNC := nc
			if siteURL != "" {
				at := *g
				at.natsURL, at.urlGiven, at.contextName = siteURL, true, ""
				if siteNC, _, err = at.connect(ctx, "steward site setup", false); err != nil {
					return fmt.Errorf("--site-url: %w", err)
				}
				defer siteNC.Close()
				if d := siteNC.ConnectedDomain(); d != site.Name {
					return fmt.Errorf("--site-url %s is a server in JetStream domain %q, not site %s's leaf node; give the leaf node's client address (steward site config --listen)", redactURL(siteURL), d, site.Name)
				}
			}
			siteJS, err := events.JetStreamIn(siteNC, site.Name)
			if err != nil {
				return err
			}
			sctx, cancel := context.WithTimeout(ctx, siteSetupTimeout)
			defer cancel()
			if err := setupSiteOnceLinked(sctx, siteJS, hubJS, cfg, site); err != nil {
				if errors.Is(err, events.ErrMembershipRollback) {
					return fmt.Errorf("steward site setup: %w", err)
				}
				hint := fmt.Sprintf("is the leaf node of site %s linked to this hub?", site.Name)
				if siteURL == "" {
					hint += " On the closed bus, give --site-url: the site's leaf identity lets the hub read a site's JetStream, not change it"
				}
				return fmt.Errorf("steward site setup: %w (%s)", err, hint)
			}
			out := cmd.OutOrStdout()
			if st, err := siteJS.Stream(sctx, events.StreamEvents); err != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: site %s: %s was set up and could not be read back for its persist mode (%v); steward status at the hub reads it again\n", site.Name, events.StreamEvents, err)
			} else if err := events.CheckSiteEventsSynced(site.Name, st.CachedInfo().Config); err != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: %v\n", err)
			}
			// Both ends of the link source across it. Without --site-url
			// the leaf node's version is not seen: the hub's is.
			warnOfServer := func(what string, end *nats.Conn) {
				if err := events.CheckSiteServer(what, end.ConnectedUrlRedacted(), end.ConnectedServerVersion()); err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "warning: %v\n", err)
				}
			}
			warnOfServer("the hub", nc)
			if siteURL != "" {
				warnOfServer("site "+site.Name+"'s leaf node", siteNC)
			}
			fmt.Fprintf(out, "site %s: STEWARD_EVENTS sources %s's STEWARD_EVENTS through its consumer %s, on %d subjects (%d boxes, %d hives, %d machines)\n",
				site.Name, site.HubDomain, events.SiteConsumer(site.Name), len(site.EventSubjects()), len(site.Boxes), len(site.Hives), len(site.Machines))
			if fromMembership {
				fmt.Fprintf(out, "site %s: keys from its signed membership, generation %d (recorded on the hub's consumer %s)\n", site.Name, site.Generation, events.SiteConsumer(site.Name))
			}
			fmt.Fprintf(out, "site %s: STEWARD_OUTCOMES, STEWARD_DLQ and bucket %s set up; the hub's STEWARD_OUTCOMES and STEWARD_DLQ source them\n", site.Name, events.CheckpointBucket)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&site.HubDomain, "hub-domain", events.DefaultHubDomain, "the hub's JetStream domain (jetstream { domain } in its configuration)")
	fs.StringSliceVar(&site.Boxes, "boxes", nil, "unsigned (open bus, first set-up): the site's boxes (join), comma-separated")
	fs.StringSliceVar(&site.Hives, "hives", nil, "unsigned (open bus, first set-up): the site's hives (credential), comma-separated")
	fs.StringSliceVar(&site.Machines, "machines", nil, "unsigned (open bus, first set-up): the site's machines (provision), comma-separated")
	fs.StringVar(&keysFile, "keys-file", "", `unsigned (open bus, first set-up): file of the site's keys, one a line: "box NAME", "hive NAME" or "machine NAME"`)
	fs.StringVar(&controllerKeys, "controller-key", "", "the controller's ed25519 public keys (PEM) the site's membership is verified with, as the workers take them: one file with one or more PUBLIC KEY blocks, or files separated by commas; used when no keys are given")
	fs.StringVar(&siteURL, "site-url", "", "the site's leaf node (nats://HOST:PORT): the site's streams are made there; required on the closed bus")
	fs.Int64Var(&maxBytes, "max-bytes", events.DefaultMaxBytes, "bytes the site's STEWARD_EVENTS and STEWARD_OUTCOMES may each hold")
	fs.Int64Var(&dlqMax, "dlq-max-bytes", events.DefaultDLQMaxBytes, "bytes the site's STEWARD_DLQ may hold")
	fs.Int64Var(&cpMaxBytes, "checkpoint-max-bytes", events.DefaultCheckpointMaxBytes, "bytes the site's checkpoint bucket may hold")
	return cmd
}

// setupSiteOnceLinked sets the site up, asking again while nothing in the
// site's domain answers (its leaf node is starting, or not linked yet, as
// when a compose project starts the hub, the leaf node and this together),
// until ctx ends.
func setupSiteOnceLinked(ctx context.Context, siteJS, hubJS jetstream.JetStream, cfg events.BusConfig, site events.Site) error {
	for {
		err := events.SetupSite(ctx, siteJS, hubJS, cfg, site)
		if !errors.Is(err, nats.ErrNoResponders) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Second):
		}
	}
}

// readSiteKeys adds the keys listed in path to s.
func readSiteKeys(path string, s *events.Site) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("--keys-file: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			return fmt.Errorf("--keys-file %s line %d: want \"box|hive|machine NAME\", found %d fields", path, n, len(fields))
		}
		switch fields[0] {
		case "box":
			s.Boxes = append(s.Boxes, fields[1])
		case "hive":
			s.Hives = append(s.Hives, fields[1])
		case "machine":
			s.Machines = append(s.Machines, fields[1])
		default:
			return fmt.Errorf("--keys-file %s line %d: kind %q: want box, hive or machine", path, n, fields[0])
		}
	}
	return sc.Err()
}

func newSiteStatusCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "status",
		Short: "At the hub: each site's link and how many of its events it has not stored yet",
		Long: `List the sites set up at this hub, from the hub's durable consumer for each:
LINKED says the site's leaf node is sourcing now; PENDING is how many of the
site's events the hub holds and has not sent it yet (during a cut it grows with
every event published for the site; the hub keeps them for its retention);
OLDEST PENDING is the age of the oldest of them, about how long the site has
been behind; UNCONFIRMED were sent and not yet confirmed by the site's flow control (stored
there, or lost with a cut and sent again); SOURCED is "ok" when the hub hears
from its sources of the site's outcomes and dead letters, or names each that
has been silent 10s or more (during a cut, all; while the site is linked, what
steward site keep restarts); LAST ACTIVE is when the site last took or
confirmed one.`,
		Args: cobra.NoArgs,
	}
	out := addOutputFlags(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		asJSON, err := out.asJSON()
		if err != nil {
			return err
		}
		nc, js, err := g.connect(cmd.Context(), "steward site status", false)
		if err != nil {
			return err
		}
		defer nc.Close()
		sites, err := ops.Sites(cmd.Context(), js)
		if err != nil {
			return withServerHint(g, err)
		}
		if asJSON {
			return printJSON(cmd.OutOrStdout(), sites)
		}
		now := time.Now()
		t := newTable(cmd.OutOrStdout(), "SITE", "LINKED", "PENDING", "OLDEST PENDING", "UNCONFIRMED", "SOURCED", "SUBJECTS", "LAST ACTIVE")
		for _, s := range sites {
			active := "never"
			if s.LastActive != nil {
				active = ago(now, *s.LastActive)
			}
			t.row(s.Name, s.Linked, s.Pending, siteAge(s), s.Unconfirmed, siteSourced(s), s.Subjects, active)
		}
		if len(sites) == 0 {
			t.line("(no sites: steward site setup NAME makes one)")
		}
		return t.flush()
	}
	return cmd
}

func newSiteKeepCmd(g *globals) *cobra.Command {
	var stallAfter, interval time.Duration
	cmd := &cobra.Command{
		Use:   "keep",
		Short: "At the hub: keep each linked site's outcomes and dead letters sourced, restarting a source that stalled",
		Long: `Run beside the hub, as the operator: every --interval, read the hub's sources of
each site's STEWARD_OUTCOMES and STEWARD_DLQ, and restart each that has had no
contact with its site for --stall-after while the site has been linked as long
(the hub's consumer for its events is bound). nats-server does not retry a
source whose request was in flight when the site's link came back, and retries
one that failed through a cut with a backoff of up to two minutes; without the
keeper a site's outcomes reach the hub that much later. Nothing is lost either
way: the site holds them. A restart takes the source out of the hub's stream
and puts it back; each is logged with the site, the stream and how long it was
silent. It runs until it is stopped (SIGINT or SIGTERM).`,
		Example: `  steward site keep --nats-url nats://hub:4222`,
		Args:    cobra.NoArgs,
	}
	cmd.Flags().DurationVar(&stallAfter, "stall-after", ops.DefaultStallAfter, "how long a linked site's source may go without contact before it is restarted")
	cmd.Flags().DurationVar(&interval, "interval", 2*time.Second, "how often the hub's sources are read")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if interval <= 0 {
			return fmt.Errorf("--interval %v: want a positive duration", interval)
		}
		if stallAfter <= 0 {
			return fmt.Errorf("--stall-after %v: want a positive duration", stallAfter)
		}
		nc, js, err := g.connect(cmd.Context(), "steward site keep", true)
		if err != nil {
			return err
		}
		defer nc.Close()
		k, err := ops.NewSourceKeeper(js, ops.WithStallAfter(stallAfter))
		if err != nil {
			return err
		}
		g.log.Info().Dur("stall_after", stallAfter).Dur("interval", interval).Msg("keeping the hub's sources of every site")
		err = k.Run(cmd.Context(), interval, func(restarts []ops.SourceRestart, err error) {
			if err != nil {
				g.log.Warn().Err(err).Msg("the hub's sources were not read; trying again at the next interval")
			}
			for _, r := range restarts {
				if r.Err != nil {
					g.log.Error().Err(r.Err).Str("site", r.Site).Str("stream", r.Stream).Dur("silent", r.Silent).Msg("the hub's source of a linked site stalled and was not restarted")
					continue
				}
				g.log.Info().Str("site", r.Site).Str("stream", r.Stream).Dur("silent", r.Silent).Msg("the hub's source of a linked site had stalled, so it was restarted")
			}
		})
		if errors.Is(err, context.Canceled) {
			return nil
		}
		return err
	}
	return cmd
}
