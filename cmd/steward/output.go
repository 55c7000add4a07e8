package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/internal/ops"
)

// outputFlags are --json and -o/--output, which every command that prints
// a table or a report takes: a script reads the JSON, a person the table.
type outputFlags struct {
	json   bool
	format string
}

// addOutputFlags registers --json and -o/--output on cmd (persistent, so
// subcommands such as `replay credential` take them too).
func addOutputFlags(cmd *cobra.Command) *outputFlags {
	o := &outputFlags{}
	fs := cmd.PersistentFlags()
	fs.BoolVar(&o.json, "json", false, "print JSON instead of a table (the same as -o json)")
	fs.StringVarP(&o.format, "output", "o", "table", "output format: table or json")
	return o
}

// asJSON says whether JSON was asked for.
func (o *outputFlags) asJSON() (bool, error) {
	switch o.format {
	case "json":
		return true, nil
	case "table", "":
		return o.json, nil
	}
	return false, fmt.Errorf("-o %q: want table or json", o.format)
}

// printJSON writes v as indented JSON and a newline. HTML characters are
// kept as they are: the reader is a program or a terminal, not a browser.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table prints aligned columns. Every cell is escaped (ops.Printable): a
// key, an error or an event id read from the bus is data, and a terminal
// must show it rather than act on it.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)}
	if len(header) > 0 {
		fmt.Fprintln(t.tw, strings.Join(header, "\t"))
	}
	return t
}

// row prints one line; cells are formatted by cell.
func (t *table) row(cells ...any) {
	parts := make([]string, len(cells))
	for i, c := range cells {
		parts[i] = cell(c)
	}
	fmt.Fprintln(t.tw, strings.Join(parts, "\t"))
}

// line prints text across the columns (a heading, a blank line).
func (t *table) line(format string, args ...any) {
	fmt.Fprintln(t.tw, ops.Printable(fmt.Sprintf(format, args...)))
}

func (t *table) flush() error { return t.tw.Flush() }

// cell formats one table cell: times in RFC 3339 UTC, a missing time or an
// empty string as "-".
func cell(v any) string {
	switch x := v.(type) {
	case string:
		if x == "" {
			return "-"
		}
		return ops.Printable(x)
	case time.Time:
		if x.IsZero() {
			return "-"
		}
		return x.UTC().Format(time.RFC3339)
	case *time.Time:
		if x == nil || x.IsZero() {
			return "-"
		}
		return x.UTC().Format(time.RFC3339)
	case bool:
		if x {
			return "yes"
		}
		return "no"
	}
	return ops.Printable(fmt.Sprint(v))
}

// plural counts n of a thing whose plural adds an s: "1 round", "3 rounds".
func plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}

// ago says how long before now t was, rounded for a person.
func ago(now, t time.Time) string {
	d := now.Sub(t)
	switch {
	case d < 0:
		return "in " + roundDur(-d)
	case d < time.Second:
		return "just now"
	}
	return roundDur(d) + " ago"
}

func roundDur(d time.Duration) string {
	switch {
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return d.Round(time.Minute).String()
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// withServerHint adds to an error that found no Steward streams which
// setting chose the server asked, so an operator who forgot
// STEWARD_NATS_URL learns it from the first command.
func withServerHint(g *globals, err error) error {
	var none *ops.NoStreamsError
	if errors.As(err, &none) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("%w; the server asked was %s, chosen by --nats-url or STEWARD_NATS_URL (default %s)", err, redactURL(g.natsURL), nats.DefaultURL)
	}
	return err
}
