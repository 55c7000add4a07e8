package provision

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"filippo.io/age"
	"github.com/jackc/pgx/v5"
	"github.com/spf13/pflag"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/agekey"
	"github.com/steward-dev/steward/workers/workertest"
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
	base := Config{Machine: "m1", AgeIdentity: good, DatabaseURL: defaultTestURL, ControllerKey: testControllerPub}
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
		{"no controller key", func(c *Config) { c.ControllerKey = "" }, "--controller-key", ""},
		{"controller key that is a private key", func(c *Config) { c.ControllerKey = testControllerKey }, "--controller-key", "PRIVATE KEY-----"},
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

// TestDev prepares the development instance as a newcomer would get it:
// the identity, password and grant are made once, 0600, and reused; the
// printed publish line names grant.json, which a worker on the dev config
// applies against the real PostgreSQL, after which the role connects as the
// printed psql line says; Dev says provision is not running when nothing
// answers, and never overwrites an identity file it cannot read.
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
	devServerState(t)

	cfg, lines, err := Dev(ctx, dir)
	if err != nil {
		t.Fatalf("Dev with PostgreSQL answering: %v", err)
	}
	base := filepath.Join(dir, "provision")
	path, passwordPath, grantPath := filepath.Join(base, "identity.txt"), filepath.Join(base, "app-password"), filepath.Join(base, "grant.json")
	if cfg.Machine != DevMachine || cfg.AgeIdentity != path || cfg.RolePrefix != DefaultRolePrefix {
		t.Fatalf("config %+v", cfg)
	}
	first := map[string][]byte{}
	for _, p := range []string{path, passwordPath, grantPath} {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, mode %v, want 0600", p, err, fi.Mode())
		}
		first[p], _ = os.ReadFile(p)
	}
	id, err := agekey.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	recipient := id.Recipients()[0]
	password := strings.TrimSpace(string(first[passwordPath]))
	if len(password) < 16 {
		t.Fatalf("the development password is %d characters", len(password))
	}

	// grant.json is generation 1 for dev-db, one consumer, its secret the
	// password encrypted to the machine's identity.
	var g events.GrantChanged
	if err := json.Unmarshal(first[grantPath], &g); err != nil {
		t.Fatalf("grant.json: %v", err)
	}
	if g.Machine != DevMachine || g.Requirement != "postgres" || g.Generation != 1 || len(g.Given) != 1 ||
		g.Given[0].From != "dev" || g.Given[0].Node != "app" || g.Given[0].Values.Name != "app" {
		t.Fatalf("grant.json holds %+v", g)
	}
	if strings.Contains(string(first[grantPath]), password) {
		t.Fatal("grant.json holds the password in plaintext")
	}
	if plain, err := id.Decrypt(g.Given[0].Secret); err != nil || string(plain) != password {
		t.Fatalf("grant.json's secret does not open to the password: %v", err)
	}

	text := strings.Join(lines, "\n")
	t.Logf("Dev prints:\n%s", text)
	m := regexp.MustCompile(`go run ./cmd/steward publish --type dev\.steward\.grant\.changed\.v1 --data @(\S+) --signing-key (\S+)\n`).FindStringSubmatch(text)
	if m == nil || m[1] != grantPath {
		t.Fatalf("no publish line naming %s in:\n%s", grantPath, text)
	}
	psql := `PGPASSWORD="$(cat ` + passwordPath + `)" psql "host=127.0.0.1 user=mesh_app dbname=app"`
	if !strings.Contains(text, recipient) || !strings.Contains(text, psql) || !strings.Contains(text, `higher "generation"`) {
		t.Fatalf("lines do not show the recipient, %s and that a change is a higher generation:\n%s", psql, text)
	}
	if strings.Contains(text, "AGE-SECRET-KEY") || strings.Contains(text, password) {
		t.Fatalf("lines show the secret key or the password:\n%s", text)
	}

	// Publish grant.json as the line does and run the dev worker on it.
	w, err := New(cfg)
	if err != nil {
		t.Fatalf("the dev config does not make a worker: %v", err)
	}
	defer w.Close()
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	run := workertest.Start(t, js, w.Spec(), w)
	raw, err := os.ReadFile(m[1])
	if err != nil {
		t.Fatal(err)
	}
	key, err := events.KeyOf(events.TypeGrantChanged, raw)
	if err != nil {
		t.Fatal(err)
	}
	// --signing-key: the line's key signs, and the dev worker verifies
	// with its public half.
	var dg events.GrantChanged
	if err := json.Unmarshal(raw, &dg); err != nil {
		t.Fatal(err)
	}
	workertest.PublishData(t, js, events.TypeGrantChanged, key, signGrantWith(t, m[2], dg))
	workertest.WaitIdle(t, js, run.ConsumerName())
	outs := workertest.Outcomes(t, js, Name, DevMachine)
	var applied Applied
	if len(outs) != 1 || outs[0].Type() != "dev.steward.grant.applied.v1" || outs[0].DataAs(&applied) != nil {
		t.Fatalf("outcomes %v, want one applied", types(outs))
	}
	assertNames(t, "created roles", applied.Created.Roles, []string{"mesh_app"})
	assertNames(t, "created databases", applied.Created.Databases, []string{"app"})
	if dls := workertest.DeadLetters(t, js, Name, DevMachine); len(dls) != 0 {
		t.Fatalf("dead letters: %+v", dls)
	}
	// Connect as the printed line does (the line's host, the password).
	cc, err := pgx.ParseConfig(fmt.Sprintf("host=127.0.0.1 port=%d user=mesh_app dbname=app sslmode=disable password=%s", pc.Port, password))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		t.Fatalf("connect as the printed line says: %v", err)
	}
	var user, database string
	err = conn.QueryRow(ctx, "SELECT current_user, current_database()").Scan(&user, &database)
	conn.Close(ctx)
	if err != nil || user != "mesh_app" || database != "app" {
		t.Fatalf("connected as %q to %q: %v", user, database, err)
	}

	// A second Dev reuses every file and prints the same lines; a lost
	// grant.json is made again for the same password.
	_, lines2, err := Dev(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	for p, b := range first {
		if again, _ := os.ReadFile(p); string(again) != string(b) {
			t.Fatalf("a second Dev changed %s", p)
		}
	}
	if strings.Join(lines2, "\n") != text {
		t.Fatal("a second Dev printed other lines")
	}
	if err := os.Remove(grantPath); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Dev(ctx, dir); err != nil {
		t.Fatal(err)
	}
	var g2 events.GrantChanged
	if raw, err := os.ReadFile(grantPath); err != nil || json.Unmarshal(raw, &g2) != nil || len(g2.Given) != 1 {
		t.Fatalf("grant.json was not made again: %v", err)
	}
	if plain, err := id.Decrypt(g2.Given[0].Secret); err != nil || string(plain) != password {
		t.Fatalf("the remade grant.json does not hold the kept password: %v", err)
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

// devServerState gives TestDev the development machine's corner of the
// server (role mesh_app, database app, generation row of dev-db) empty,
// before and after, as on a server steward dev never touched. An advisory
// lock held for the test keeps two runs from sharing it.
func devServerState(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, testURL())
	if err != nil {
		t.Fatalf("connect to the test PostgreSQL %s: %v", testURL(), err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	if _, err := admin.Exec(ctx, "SELECT pg_catalog.pg_advisory_lock(pg_catalog.hashtextextended('steward.provision.TestDev', 0))"); err != nil {
		t.Fatal(err)
	}
	reset := func() {
		var owner string
		err := admin.QueryRow(ctx, "SELECT pg_catalog.pg_get_userbyid(datdba)::text FROM pg_catalog.pg_database WHERE datname = 'app'").Scan(&owner)
		if err == nil && owner != "mesh_app" {
			t.Fatalf("database app exists and belongs to %s, not mesh_app; the development grant needs the name", owner)
		}
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		for _, q := range []string{"DROP DATABASE IF EXISTS app WITH (FORCE)", "DROP ROLE IF EXISTS mesh_app"} {
			if _, err := admin.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		var table bool
		if err := admin.QueryRow(ctx, "SELECT to_regclass('steward.provision_generation') IS NOT NULL").Scan(&table); err != nil {
			t.Fatal(err)
		}
		if table {
			if _, err := admin.Exec(ctx, "DELETE FROM steward.provision_generation WHERE machine = $1 AND prefix = $2", DevMachine, DefaultRolePrefix); err != nil {
				t.Fatal(err)
			}
		}
	}
	reset()
	t.Cleanup(reset)
}
