package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/atomicfile"
)

// The nats CLI's contexts name a server and the credentials to use with it
// (`nats context save`), one JSON file each under
// $XDG_CONFIG_HOME/nats/context/ (~/.config/nats/context/), the selected one
// named in nats/context.txt. Steward reads the same files, so an operator
// switches servers once for both tools: --context NAME (or NATS_CONTEXT),
// else the selected context, fills in whatever the command line and the
// STEWARD_* environment left unset.

// natsContext is the part of a context file Steward reads and writes; the
// field names are the nats CLI's.
type natsContext struct {
	Description     string `json:"description,omitempty"`
	URL             string `json:"url,omitempty"`
	User            string `json:"user,omitempty"`
	Password        string `json:"password,omitempty"`
	Creds           string `json:"creds,omitempty"`
	NKey            string `json:"nkey,omitempty"`
	InboxPrefix     string `json:"inbox_prefix,omitempty"`
	JetStreamDomain string `json:"jetstream_domain,omitempty"`
}

// contextDir is where the nats CLI keeps its contexts.
func contextDir() (string, error) {
	base := os.Getenv("XDG_CONFIG_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("the nats contexts: no home folder and no XDG_CONFIG_HOME: %w", err)
		}
		base = filepath.Join(home, ".config")
	}
	return filepath.Join(base, "nats"), nil
}

// loadContext reads the context name, or the selected one when name is
// empty (then a missing selection is no context and no error).
func loadContext(name string) (*natsContext, string, error) {
	dir, err := contextDir()
	if err != nil {
		return nil, "", err
	}
	if name == "" {
		raw, err := os.ReadFile(filepath.Join(dir, "context.txt"))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, "", nil
		}
		if err != nil {
			return nil, "", fmt.Errorf("the selected nats context: %w", err)
		}
		if name = strings.TrimSpace(string(raw)); name == "" {
			return nil, "", nil
		}
	}
	if err := events.CheckKey(name); err != nil {
		return nil, "", fmt.Errorf("nats context %q: %w", name, err)
	}
	path := filepath.Join(dir, "context", name+".json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("nats context %s: %w (list them with nats context ls; steward dev writes steward-dev-operator)", name, err)
	}
	var c natsContext
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, "", fmt.Errorf("nats context %s (%s) is not a context file: %w", name, path, err)
	}
	return &c, name, nil
}

// applyContext fills the connection flags the command line and the
// environment left unset from the context named by --context or
// NATS_CONTEXT, or the selected one. A password in a context is written to
// a 0600 file beside it for --nats-password-file, which takes secrets by
// file only.
func (g *globals) applyContext(flags *pflag.FlagSet) error {
	name := g.natsContext
	if name == "" {
		name = os.Getenv("NATS_CONTEXT")
	}
	explicit := name != ""
	for _, f := range []string{"nats-url", "nats-creds", "nats-user", "nats-nkey"} {
		if fl := flags.Lookup(f); fl != nil && fl.Changed && !explicit {
			// A server or credentials given here win over a context
			// nobody named.
			return nil
		}
	}
	c, name, err := loadContext(name)
	if err != nil || c == nil {
		return err
	}
	set := func(flag string, v string, into *string) {
		if fl := flags.Lookup(flag); v != "" && (fl == nil || !fl.Changed) {
			*into = v
		}
	}
	set("nats-url", c.URL, &g.natsURL)
	set("nats-creds", expandHome(c.Creds), &g.natsCreds)
	set("nats-nkey", expandHome(c.NKey), &g.natsNkey)
	set("nats-user", c.User, &g.natsUser)
	set("nats-inbox-prefix", c.InboxPrefix, &g.natsInbox)
	set("js-domain", c.JetStreamDomain, &g.jsDomain)
	if c.Password != "" && g.natsPasswordFile == "" {
		dir, err := contextDir()
		if err != nil {
			return err
		}
		path := filepath.Join(dir, "context", "."+name+".password")
		if err := atomicfile.Write(path, []byte(c.Password), 0o600); err != nil {
			return fmt.Errorf("nats context %s: %w", name, err)
		}
		g.natsPasswordFile = path
	}
	g.contextName = name
	return nil
}

// expandHome turns a leading ~/ into the home folder, as the nats CLI does.
func expandHome(p string) string {
	if rest, ok := strings.CutPrefix(p, "~/"); ok {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, rest)
		}
	}
	return p
}

// devContextMark is the description of the contexts steward dev writes: it
// replaces only those, never a context someone else saved.
const devContextMark = "written by steward dev for "

// writeDevContext saves a nats context named name for the server url and
// the credentials creds, unless a context of that name exists that dev did
// not write. It returns whether it wrote one.
func writeDevContext(name, url, creds, dir string) (bool, error) {
	base, err := contextDir()
	if err != nil {
		return false, err
	}
	path := filepath.Join(base, "context", name+".json")
	if raw, err := os.ReadFile(path); err == nil {
		var c natsContext
		if json.Unmarshal(raw, &c) != nil || !strings.HasPrefix(c.Description, devContextMark) {
			return false, nil
		}
	}
	abs, err := filepath.Abs(creds)
	if err != nil {
		return false, err
	}
	raw, err := json.MarshalIndent(natsContext{Description: devContextMark + dir, URL: url, Creds: abs}, "", "  ")
	if err != nil {
		return false, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return false, fmt.Errorf("nats context %s: %w", name, err)
	}
	if err := atomicfile.Write(path, append(raw, '\n'), 0o600); err != nil {
		return false, fmt.Errorf("nats context %s: %w", name, err)
	}
	return true, nil
}
