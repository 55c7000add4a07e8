package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// placeholder is what a flag's value is called in --help: a type word.
// pflag takes the first backquoted word of a usage as the name instead, so
// a usage quoting `steward creds issue` renders as a nonsense placeholder.
var placeholder = regexp.MustCompile(`^[A-Za-z0-9]*$`)

// TestEveryHelpNamesFlagValuesByType runs --help for every command of the
// tree and fails on a flag whose value placeholder is not a plain type word.
func TestEveryHelpNamesFlagValuesByType(t *testing.T) {
	var walk func(c *cobra.Command)
	n := 0
	walk = func(c *cobra.Command) {
		n++
		path := c.CommandPath()
		check := func(f *pflag.Flag) {
			if name, _ := pflag.UnquoteUsage(f); !placeholder.MatchString(name) {
				t.Errorf("%s --%s: its --help placeholder is %q; a backquote in the usage names it, so rephrase the usage without backquotes", path, f.Name, name)
			}
		}
		c.LocalFlags().VisitAll(check)
		c.InheritedFlags().VisitAll(check)
		root := newRoot()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(append(strings.Fields(path)[1:], "--help"))
		if err := root.Execute(); err != nil {
			t.Errorf("%s --help: %v\n%s", path, err, out.String())
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRoot())
	if n < 10 {
		t.Fatalf("walked %d commands; the tree is not the one newRoot builds", n)
	}
}
