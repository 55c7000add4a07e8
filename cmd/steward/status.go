package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/internal/ops"
)

func newStatusCmd(g *globals) *cobra.Command {
	var o ops.StatusOptions
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Say what is stuck and why: every worker instance's consumer, retrying and waiting keys, DLQ depth",
		Long: `Print the NATS server asked, Steward's streams, and every worker instance:
whether a process is consuming it (and since when it was last active), its
pending events and the age of the oldest, the keys it is retrying (attempt,
first failure, last error) and the keys waiting behind an earlier event (and
which), whether it is paused, and its dead letters.

Instances are counted by state and listed worst first; --limit bounds the list
(the rest are counted), --worker and --instance narrow it. The view costs the
server the same few requests at any fleet size: one paged consumer listing,
one read of the status documents, one count of dead letters, and one read per
instance listed for its oldest pending event.

At a hub with sites (docs/design.md §9) it shows each site too: LINKED says its
leaf node is sourcing now, PENDING how many of its events the hub holds and has
not sent it, OLDEST PENDING the age of the oldest of them, and its instances as
they last reported, read from the site's own bucket through the hub and
verified in the site's domain. A site that cannot be read (its link is cut) is
shown unreachable, with why: its instances are unknown until the link is back.
A site whose set-up risks losing events (its events stream written async by an
earlier set-up) is warned of under the sites.`,
		Example: `  steward status
  steward status --worker credential --limit 50
  steward status --instance credential-hive-7 -o json`,
		Args: cobra.NoArgs,
	}
	out := addOutputFlags(cmd)
	fs := cmd.Flags()
	fs.StringVar(&o.Worker, "worker", "", "only this worker's instances (converge, join, credential, provision)")
	fs.StringVar(&o.Instance, "instance", "", "only this instance: its consumer name (credential-hive-7) or its instance (hive-7)")
	fs.IntVar(&o.Limit, "limit", ops.DefaultLimit, "list at most this many instances, worst first (-1: all)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		asJSON, err := out.asJSON()
		if err != nil {
			return err
		}
		if o.Limit == 0 {
			return fmt.Errorf("--limit 0 lists nothing: give a positive number, or -1 for every instance")
		}
		nc, js, err := g.connect(cmd.Context(), "steward status", false)
		if err != nil {
			return err
		}
		defer nc.Close()
		if o.Docs, err = g.documents(cmd.Context(), js); err != nil {
			return err
		}
		st, err := ops.GetStatus(cmd.Context(), js, o)
		if err != nil {
			return withServerHint(g, err)
		}
		if asJSON {
			return printJSON(cmd.OutOrStdout(), st)
		}
		return printStatus(cmd.OutOrStdout(), st)
	}
	return cmd
}

// printStatus prints a status as tables: the server, the streams, the
// counts by state, the instances, then their retrying and waiting keys.
func printStatus(w io.Writer, st *ops.Status) error {
	now := st.Time
	t := newTable(w)
	server := st.Server
	if st.ServerVersion != "" {
		server += fmt.Sprintf(" (server %s, version %s)", st.ServerName, st.ServerVersion)
	}
	t.line("NATS %s", server)
	if st.ServerWarning != "" {
		t.line("warning: %s", st.ServerWarning)
	}
	t.line("")
	t.row("STREAM", "MESSAGES", "BYTES", "FIRST SEQ", "LAST SEQ", "CONSUMERS")
	for _, s := range st.Streams {
		if s.Missing {
			t.row(s.Name, "-", "-", "-", "-", "missing (steward setup creates it)")
			continue
		}
		t.row(s.Name, s.Messages, s.Bytes, s.FirstSeq, s.LastSeq, s.Consumers)
	}
	t.line("")
	t.line("INSTANCES %d: %s; DEAD LETTERS %d", st.Total, summaryCounts(st.InstanceSummary), st.DeadLetters)
	if st.Total == 0 {
		t.line("(no worker instance has a consumer or a status document yet: start one with `steward worker`)")
	} else {
		printInstances(t, now, "", st.InstanceSummary)
	}
	if len(st.Sites) > 0 {
		printSites(t, now, st.Sites)
	}
	return t.flush()
}

// summaryCounts is the instances of a summary counted by state, worst
// first, the states with none left out.
func summaryCounts(sum ops.InstanceSummary) string {
	var counts []string
	for _, s := range ops.States {
		if n := sum.Counts[s]; n > 0 {
			counts = append(counts, fmt.Sprintf("%d %s", n, s))
		}
	}
	if len(counts) == 0 {
		return "none"
	}
	return strings.Join(counts, ", ")
}

// printSites prints each site the hub sources to: its link, how far
// behind it is, and its instances as they last reported, read from the
// site; a site that cannot be read says why, and nothing of its instances.
func printSites(t *table, now time.Time, sites []ops.SiteStatus) {
	t.line("")
	t.row("SITE", "LINKED", "PENDING", "OLDEST PENDING", "UNCONFIRMED", "SOURCED", "INSTANCES")
	for _, s := range sites {
		instances := fmt.Sprintf("%d: %s; dead letters %d", s.Total, summaryCounts(s.InstanceSummary), s.DeadLetters)
		if s.Unreachable != "" {
			instances = "unreachable: " + s.Unreachable
		}
		t.row(s.Name, s.Linked, s.Pending, siteAge(s.Site), s.Unconfirmed, siteSourced(s.Site), instances)
	}
	for _, s := range sites {
		if s.Warning != "" {
			t.line("warning: %s", s.Warning)
		}
	}
	for _, s := range sites {
		if s.Unreachable == "" && s.Total > 0 {
			printInstances(t, now, s.Name, s.InstanceSummary)
		}
	}
}

// siteAge is the age of the oldest event held for a site and not sent.
func siteAge(s ops.Site) string {
	if s.OldestPending == nil {
		return "-"
	}
	return roundDur(time.Duration(s.OldestPendingSeconds * float64(time.Second)))
}

// siteSourced says whether the hub hears from its sources of a site's
// outcomes and dead letters: "ok", or each silent one and for how long.
func siteSourced(s ops.Site) string {
	if len(s.SilentSources) == 0 {
		return "ok"
	}
	var out []string
	for _, src := range s.SilentSources {
		out = append(out, src.Stream+" silent "+roundDur(time.Duration(src.SilentSeconds*float64(time.Second))))
	}
	return strings.Join(out, ", ")
}

// printInstances prints the instances of one domain, worst first, and
// what is wrong with them: forgeries, dead letters, retrying and waiting
// keys. site names the site they are at ("" at the bus asked).
func printInstances(t *table, now time.Time, site string, st ops.InstanceSummary) {
	t.line("")
	if site != "" {
		t.line("SITE %s", site)
	}
	t.row("INSTANCE", "STATE", "CONSUMING", "LAST ACTIVE", "PENDING", "ACK PENDING", "OLDEST PENDING", "RETRYING", "WAITING", "DLQ", "PAUSED UNTIL")
	for _, in := range st.Instances {
		active := "never"
		if in.LastActive != nil {
			active = ago(now, *in.LastActive)
		}
		oldest := "-"
		if in.OldestPending != nil {
			oldest = roundDur(time.Duration(in.OldestPendingSeconds * float64(time.Second)))
		}
		consuming := cell(in.Consuming)
		if !in.HasConsumer {
			consuming = "no consumer"
		} else if in.Consuming {
			consuming = fmt.Sprintf("yes (%d pulls)", in.PullsWaiting)
		}
		t.row(in.Name, string(in.State), consuming, active, in.Pending, in.AckPending, oldest,
			len(in.Retrying), len(in.Waiting), in.DeadLetters, in.PausedUntil)
	}
	if st.More > 0 {
		t.line("... and %d more instances (they are no worse than those above): narrow with --worker or --instance, or raise --limit", st.More)
	}
	var retrying, waiting, forged bool
	for _, in := range st.Instances {
		retrying = retrying || len(in.Retrying) > 0
		waiting = waiting || len(in.Waiting) > 0
		forged = forged || len(in.Forgeries) > 0
	}
	if forged {
		// A forged document names an identity that writes where it may
		// not: docs/design.md §7 says what to do next.
		t.line("")
		t.row("FORGED IN", "KIND", "KEY", "REVISION", "REFLECTED FROM", "WHY NOT BELIEVED")
		for _, in := range st.Instances {
			for _, f := range in.Forgeries {
				t.row(in.Name, string(f.Kind), f.Key, f.Revision, cell(f.ReflectedFrom), f.Reason)
			}
		}
		t.line("(each was not believed and fell back safely; revoke the credentials of the identity that wrote it, docs/design.md §7)")
	}
	if slices.ContainsFunc(st.Instances, func(in ops.Instance) bool { return in.LastDeadLetter != nil }) {
		// Why an instance has letters waiting, without a second command:
		// its newest letter's reason (steward dlq ls lists them all).
		t.line("")
		t.row("LAST DEAD LETTER IN", "KEY", "EVENT", "STORED", "REASON")
		for _, in := range st.Instances {
			if l := in.LastDeadLetter; l != nil {
				reason := l.Reason
				if l.Forged != "" {
					reason = "FORGED: " + l.Forged
				}
				t.row(in.Name, cell(l.Key), cell(l.EventID), ago(now, l.Time), reason)
			}
		}
	}
	if retrying {
		t.line("")
		t.row("RETRYING IN", "KEY", "EVENT", "SEQ", "ATTEMPT", "FIRST FAILURE", "NEXT ATTEMPT", "LAST ERROR")
		for _, in := range st.Instances {
			name := in.Name
			if in.Stopped {
				name += " (process stopped)"
			}
			for _, r := range in.Retrying {
				t.row(name, r.Key, r.EventID, r.Sequence, r.Attempt, ago(now, r.FirstFailure), ago(now, r.NextAttempt), r.LastError)
			}
		}
	}
	if waiting {
		t.line("")
		t.row("WAITING IN", "KEY", "EVENT", "SEQ", "BEHIND SEQ", "SINCE")
		for _, in := range st.Instances {
			for _, wk := range in.Waiting {
				t.row(in.Name, wk.Key, wk.EventID, wk.Sequence, wk.Behind, ago(now, wk.Since))
			}
		}
	}
}
