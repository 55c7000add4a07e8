package provision

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"filippo.io/age"
	"github.com/jackc/pgx/v5"
	"github.com/spf13/pflag"

	"github.com/steward-dev/steward/events"
)

// TestNewRefusesBadConfig checks each bad setting is refused with the
// flag's name and rule, and that no key material or database password is
// quoted back.
func TestNewRefusesBadConfig(t *testing.T) {
	dir := t.TempDir()
	id, _ := age.GenerateX25519Identity()
	good := filepath.Join(dir, "identity.txt")
	if err := os.WriteFile(good, []byte(id.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	garbage := filepath.Join(dir, "garbage.txt")
	if err := os.WriteFile(garbage, []byte("AGE-SECRET-KEY-1NOTAKEYATALLBUTSECRETLOOKING\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := Config{Machine: "m1", AgeIdentity: good, DatabaseURL: defaultTestURL}
	cases := []struct {
		what   string
		patch  func(*Config)
		flag   string
		secret string
	}{
		{"no machine", func(c *Config) { c.Machine = "" }, "--machine", ""},
		{"machine with a dot", func(c *Config) { c.Machine = "a.b" }, "--machine", ""},
		{"machine with a wildcard", func(c *Config) { c.Machine = ">" }, "--machine", ""},
		{"upper-case prefix", func(c *Config) { c.RolePrefix = "Mesh_" }, "--role-prefix", ""},
		{"prefix with a quote", func(c *Config) { c.RolePrefix = `m"` }, "--role-prefix", ""},
		{"prefix pg_", func(c *Config) { c.RolePrefix = "pg_mesh" }, "--role-prefix", ""},
		{"prefix over 32 bytes", func(c *Config) { c.RolePrefix = strings.Repeat("m", 33) }, "--role-prefix", ""},
		{"no identity", func(c *Config) { c.AgeIdentity = "" }, "--age-identity", ""},
		{"missing identity", func(c *Config) { c.AgeIdentity = filepath.Join(dir, "nope") }, "--age-identity", ""},
		{"identity that does not parse", func(c *Config) { c.AgeIdentity = garbage }, "--age-identity", "NOTAKEYATALL"},
		{"database URL that does not parse", func(c *Config) { c.DatabaseURL = "postgres://u:hunter2secret@127.0.0.1:99999999/x" }, "--database-url", "hunter2secret"},
	}
	for _, c := range cases {
		cfg := base
		c.patch(&cfg)
		w, err := New(cfg)
		if err == nil {
			w.Close()
			t.Errorf("%s: accepted", c.what)
			continue
		}
		if !strings.Contains(err.Error(), c.flag) {
			t.Errorf("%s: %v does not name %s", c.what, err, c.flag)
		}
		if c.secret != "" && strings.Contains(err.Error(), c.secret) {
			t.Errorf("%s: the error quotes secret material: %v", c.what, err)
		}
	}

	w, err := New(base)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if w.prefix != DefaultRolePrefix {
		t.Fatalf("default prefix %q", w.prefix)
	}
	spec := w.Spec()
	if spec.Name != "provision" || spec.Instance != "m1" || len(spec.Subjects) != 1 || spec.Subjects[0] != "steward.events.grant.changed.m1" ||
		len(spec.Types) != 1 || spec.Types[0] != events.TypeGrantChanged {
		t.Fatalf("spec %+v", spec)
	}
}

func TestAddFlags(t *testing.T) {
	var c Config
	fs := pflag.NewFlagSet("provision", pflag.ContinueOnError)
	c.AddFlags(fs)
	if c.RolePrefix != DefaultRolePrefix {
		t.Fatalf("default --role-prefix %q", c.RolePrefix)
	}
	if err := fs.Parse([]string{"--machine", "db-7", "--age-identity", "/k", "--database-url", "postgres://x@h/d", "--role-prefix", "app_"}); err != nil {
		t.Fatal(err)
	}
	want := Config{Machine: "db-7", AgeIdentity: "/k", DatabaseURL: "postgres://x@h/d", RolePrefix: "app_"}
	if c != want {
		t.Fatalf("parsed %+v, want %+v", c, want)
	}
}

// TestDev prepares the development instance twice (the identity is made
// once, 0600, and reused), finds PostgreSQL through the libpq variables,
// says provision is not running when nothing answers, and never overwrites
// an identity file it cannot read.
func TestDev(t *testing.T) {
	pc, err := pgx.ParseConfig(testURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("PGHOST", pc.Host)
	t.Setenv("PGPORT", strconv.Itoa(int(pc.Port)))
	t.Setenv("PGUSER", pc.User)
	t.Setenv("PGDATABASE", pc.Database)
	t.Setenv("PGSSLMODE", "disable")
	ctx := context.Background()
	dir := t.TempDir()

	cfg, lines, err := Dev(ctx, dir)
	if err != nil {
		t.Fatalf("Dev with PostgreSQL answering: %v", err)
	}
	path := filepath.Join(dir, "provision", "identity.txt")
	if cfg.Machine != DevMachine || cfg.AgeIdentity != path || cfg.RolePrefix != DefaultRolePrefix {
		t.Fatalf("config %+v", cfg)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("identity file: %v, mode %v", err, fi.Mode())
	}
	first, _ := os.ReadFile(path)
	ids, err := age.ParseIdentities(strings.NewReader(string(first)))
	if err != nil {
		t.Fatal(err)
	}
	recipient := ids[0].(*age.X25519Identity).Recipient().String()
	text := strings.Join(lines, "\n")
	if !strings.Contains(text, recipient) || !strings.Contains(text, "go run ./cmd/steward publish") || strings.Contains(text, "AGE-SECRET-KEY") {
		t.Fatalf("lines do not show the recipient and the publish command (or show the secret key):\n%s", text)
	}
	w, err := New(cfg)
	if err != nil {
		t.Fatalf("the dev config does not make a worker: %v", err)
	}
	w.Close()

	_, lines2, err := Dev(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := os.ReadFile(path)
	if string(again) != string(first) || strings.Join(lines2, "\n") != text {
		t.Fatal("a second Dev did not reuse the identity")
	}

	t.Setenv("PGPORT", "1")
	cfg, lines, err = Dev(ctx, dir)
	if err == nil || !strings.Contains(err.Error(), "provision is not running") || !strings.Contains(err.Error(), ":1 ") {
		t.Fatalf("Dev with nothing on the port: %v", err)
	}
	if cfg.Machine != DevMachine || len(lines) == 0 {
		t.Fatalf("Dev without PostgreSQL still says how grants are published: %+v %q", cfg, lines)
	}

	if err := os.WriteFile(path, []byte("not an identity\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Dev(ctx, dir); err == nil || !strings.Contains(err.Error(), "holds no age identity") {
		t.Fatalf("Dev over an unreadable identity: %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "not an identity\n" {
		t.Fatal("Dev overwrote an identity file it could not read")
	}
}
