package provision

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/steward-dev/steward/workers/workertest"
)

// TestHostileNamesRefused sends, beside one valid consumer, a consumer
// with a hostile node, database name or password, and checks the grant is
// refused by the rule named and that nothing at all was created.
func TestHostileNamesRefused(t *testing.T) {
	e := newEnv(t)
	st := &statements{}
	w := e.worker(st)
	ok := giv{"ok", e.db("ok"), "p-ok"}
	over := func(n int) string { return strings.Repeat("n", n) }
	cases := []struct {
		what  string
		given []giv
		rule  string
	}{
		{"node with a quote", []giv{ok, {`a"b`, e.db("h"), "p"}}, "node-key"},
		{"node with a single quote", []giv{ok, {`a'b`, e.db("h"), "p"}}, "node-key"},
		{"node with a semicolon", []giv{ok, {"a;DROP ROLE postgres", e.db("h"), "p"}}, "node-key"},
		{"node with a space", []giv{ok, {"a b", e.db("h"), "p"}}, "node-key"},
		{"node with unicode", []giv{ok, {"nöde", e.db("h"), "p"}}, "node-key"},
		{"node with a dot", []giv{ok, {"a.b", e.db("h"), "p"}}, "node-key"},
		{"node '..'", []giv{ok, {"..", e.db("h"), "p"}}, "node-key"},
		{"node with a slash", []giv{ok, {"a/b", e.db("h"), "p"}}, "node-key"},
		{"node '*'", []giv{ok, {"*", e.db("h"), "p"}}, "node-key"},
		{"node of 64 characters", []giv{ok, {over(64), e.db("h"), "p"}}, "node-key"},
		{"role over 63 bytes", []giv{ok, {over(64 - len(e.prefix)), e.db("h"), "p"}}, "role-name-length"},
		{"database of 64 bytes", []giv{ok, {"h", e.prefix + strings.Repeat("d", 64-len(e.prefix)), "p"}}, "database-name-length"},
		{"database of 64 bytes in 2-byte letters", []giv{ok, {"h", strings.Repeat("é", 32), "p"}}, "database-name-length"},
		{"database with NUL", []giv{ok, {"h", e.db("a\x00b"), "p"}}, "database-name-character"},
		{"database with a newline", []giv{ok, {"h", e.db("a\nb"), "p"}}, "database-name-character"},
		{"database with a tab", []giv{ok, {"h", e.db("a\tb"), "p"}}, "database-name-character"},
		{"database with a bidi override", []giv{ok, {"h", e.db("a\u202eb"), "p"}}, "database-name-character"},
		{"database with a zero-width space", []giv{ok, {"h", e.db("a\u200bb"), "p"}}, "database-name-character"},
		{"database with a no-break space", []giv{ok, {"h", e.db("a\u00a0b"), "p"}}, "database-name-character"},
		{"database with invalid UTF-8", []giv{ok, {"h", e.db("a\xffb"), "p"}}, "database-name-character"},
		{"database with a leading space", []giv{ok, {"h", " " + e.db("h"), "p"}}, "database-name-space"},
		{"database with a trailing space", []giv{ok, {"h", e.db("h") + " ", "p"}}, "database-name-space"},
		{"database postgres", []giv{ok, {"h", "postgres", "p"}}, "database-name-reserved"},
		{"database template1", []giv{ok, {"h", "template1", "p"}}, "database-name-reserved"},
		{"database template0", []giv{ok, {"h", "template0", "p"}}, "database-name-reserved"},
		{"empty database name", []giv{ok, {"h", "", "p"}}, "database-name-empty"},
		{"node granted twice", []giv{ok, {"ok", e.db("h"), "p"}}, "duplicate-node"},
		{"database granted twice", []giv{ok, {"h", e.db("ok"), "p"}}, "duplicate-database"},
		{"empty password", []giv{ok, {"h", e.db("h"), ""}}, "password-empty"},
		{"password with a trailing newline", []giv{ok, {"h", e.db("h"), "p\n"}}, "password-character"},
		{"password with NUL", []giv{ok, {"h", e.db("h"), "p\x00q"}}, "password-character"},
		{"password with unicode", []giv{ok, {"h", e.db("h"), "pässword"}}, "password-character"},
		{"password over 1024 bytes", []giv{ok, {"h", e.db("h"), strings.Repeat("p", 1025)}}, "password-length"},
	}
	for _, c := range cases {
		st.reset()
		_, err := w.reconcile(context.Background(), e.grant(1, c.given...))
		var r *refusal
		if !errors.As(err, &r) || r.Rule != c.rule {
			t.Errorf("%s: got %v, want a refusal by rule %s", c.what, err, c.rule)
			continue
		}
		if r.Consumer != c.given[1].node || r.Reason == "" || r.Generation != 1 || r.Machine != testMachine {
			t.Errorf("%s: refusal %+v does not name the consumer, generation and machine", c.what, r.Refused)
		}
		if pw := c.given[1].password; len(pw) > 1 && strings.Contains(err.Error(), pw) {
			t.Errorf("%s: the refusal quotes the password", c.what)
		}
		if ddl := st.ddl(); len(ddl) != 0 {
			t.Errorf("%s: sent DDL %q", c.what, ddl)
		}
		if roles := e.markedRoles(); len(roles) != 0 {
			t.Fatalf("%s: roles exist after a refusal: %v", c.what, roles)
		}
		if owner := e.dbOwner(e.db("ok")); owner != "" {
			t.Fatalf("%s: the valid consumer's database was created", c.what)
		}
	}
	if e.appliedGeneration() != 0 {
		t.Fatal("a refused generation was recorded as applied")
	}
}

// TestHostileNamesQuotedExactly grants database names full of quotes,
// semicolons, spaces, backslashes and unicode, and nodes at the length
// limit, and checks each is created with exactly that name, owned by
// exactly that role, and that nothing else was touched.
func TestHostileNamesQuotedExactly(t *testing.T) {
	e := newEnv(t)
	maxNode := strings.Repeat("N", maxIdentifier-len(e.prefix))
	given := []giv{
		{"quote", e.prefix + `it's "quoted"; DROP DATABASE postgres; --`, "p1"},
		{"unicode", e.prefix + `ünïcødé 数据库 🐘`, "p2"},
		{"space", e.prefix + `two  spaces`, "p3"},
		{"backslash", e.prefix + `back\slash $1 %s ?`, "p4"},
		{"Mixed-Case_9", e.prefix + strings.Repeat("x", maxIdentifier-len(e.prefix)), "p5"},
		{maxNode, e.prefix + `"`, `p6 with ' and " and ;`},
	}
	st := &statements{}
	w := e.worker(st)
	out := apply(t, w, e.grant(1, given...))
	if len(out.Created.Roles) != len(given) || len(out.Created.Databases) != len(given) {
		t.Fatalf("created %v", out.Created)
	}
	for _, g := range given {
		role := e.role(g.node)
		if owner := e.dbOwner(g.db); owner != role {
			t.Errorf("database %q: owner %q, want %q", g.db, owner, role)
		}
		if r := e.roleState(role); !r.exists || !r.canLogin || !verifierMatches(r.verifier, g.password) {
			t.Errorf("role %q: %+v", role, r)
		}
	}
	if len(e.roleState(e.role(maxNode)).verifier) == 0 || len(e.role(maxNode)) != maxIdentifier {
		t.Fatalf("the role at the 63-byte limit was not kept whole")
	}
	var n int
	if err := e.admin.QueryRow(context.Background(), "SELECT count(*) FROM pg_database WHERE datname = 'postgres'").Scan(&n); err != nil || n != 1 {
		t.Fatalf("database postgres: %d, %v", n, err)
	}
	// Read back, the names compare equal: a second generation is a no-op.
	st.reset()
	out = apply(t, w, e.grant(2, given...))
	if len(out.Unchanged.Roles) != len(given) || len(out.Unchanged.Databases) != len(given) || len(st.ddl()) != 0 {
		t.Fatalf("the second reconcile of the same names did %+v with DDL %q", out, st.ddl())
	}
}

// TestServerLogNeverHoldsPassword turns statement logging on for the
// worker's sessions (log_statement=all, as the superuser it connects as),
// creates a role and rotates its password, and reads the server's log: the
// role statements are there, with verifiers, and the passwords are not.
func TestServerLogNeverHoldsPassword(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	logPath := serverLogFile(t, e.admin)
	start := fileSize(t, logPath)
	url := withLogStatementAll(e.url)

	marks, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer marks.Close(ctx)
	begin, end := "steward-log-mark-"+randomHex(8), "steward-log-mark-"+randomHex(8)
	if _, err := marks.Exec(ctx, "SELECT $1::text", begin); err != nil {
		t.Fatal(err)
	}

	p1, p2 := "pw-"+randomHex(16), "pw-"+randomHex(16)
	w := e.workerWith(url, nil)
	apply(t, w, e.grant(1, giv{"a", e.db("a"), p1}))
	apply(t, w, e.grant(2, giv{"a", e.db("a"), p2}))

	if _, err := marks.Exec(ctx, "SELECT $1::text", end); err != nil {
		t.Fatal(err)
	}
	var text string
	workertest.WaitUntil(t, "the end mark reaches "+logPath, func() bool {
		text = readFrom(t, logPath, start)
		return strings.Contains(text, end)
	})
	role := pgx.Identifier{e.role("a")}.Sanitize()
	for _, want := range []string{begin, "CREATE ROLE " + role, "ALTER ROLE " + role, "SCRAM-SHA-256$4096:"} {
		if !strings.Contains(text, want) {
			t.Fatalf("the server log does not hold %q, so statements were not logged and the test proves nothing", want)
		}
	}
	for _, pw := range []string{p1, p2} {
		if strings.Contains(text, pw) {
			t.Fatal("the server log holds a granted password")
		}
	}
}

func withLogStatementAll(url string) string {
	switch {
	case !strings.Contains(url, "://"):
		return url + " log_statement=all"
	case strings.Contains(url, "?"):
		return url + "&log_statement=all"
	default:
		return url + "?log_statement=all"
	}
}

// serverLogFile finds the server's log: pg_current_logfile() when the
// logging collector runs, else the file pg_ctlcluster (Debian, Ubuntu)
// sends the server's stderr to.
func serverLogFile(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	ctx := context.Background()
	var current *string
	if err := conn.QueryRow(ctx, "SELECT pg_current_logfile()").Scan(&current); err != nil {
		t.Fatal(err)
	}
	var path string
	if current != nil && *current != "" {
		path = *current
		if !filepath.IsAbs(path) {
			var dataDir string
			if err := conn.QueryRow(ctx, "SHOW data_directory").Scan(&dataDir); err != nil {
				t.Fatal(err)
			}
			path = filepath.Join(dataDir, path)
		}
	} else {
		var cluster string
		if err := conn.QueryRow(ctx, "SHOW cluster_name").Scan(&cluster); err != nil {
			t.Fatal(err)
		}
		version, name, ok := strings.Cut(cluster, "/")
		if !ok {
			t.Fatalf("the server has no logging collector and cluster_name %q is not pg_ctlcluster's <version>/<name>, so its log cannot be found", cluster)
		}
		path = filepath.Join("/var/log/postgresql", "postgresql-"+version+"-"+name+".log")
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the server's log %s cannot be read: %v", path, err)
	}
	return path
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

func readFrom(t *testing.T, path string, offset int64) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
