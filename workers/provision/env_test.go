package provision

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"filippo.io/age"
	"filippo.io/age/armor"
	"github.com/jackc/pgx/v5"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/signing"
)

// The tests run against the real PostgreSQL the brief names (trust auth,
// superuser postgres). STEWARD_TEST_DATABASE_URL points them elsewhere.
const defaultTestURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

func testURL() string {
	if u := os.Getenv("STEWARD_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return defaultTestURL
}

const testMachine = "db-1"

func TestMain(m *testing.M) {
	code := m.Run()
	cleanupFixture200()
	os.Exit(code)
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// env is one test's corner of the server: its own mark prefix, its own age
// identity, an admin connection to look with, and a cleanup that drops
// every role with its prefix and every database those roles own.
type env struct {
	tb        testing.TB
	url       string
	prefix    string
	idPath    string
	recipient *age.X25519Recipient
	admin     *pgx.Conn
	// extraRoles are roles the test made by hand, without the prefix.
	extraRoles []string
}

func newEnv(tb testing.TB) *env {
	return newEnvAt(tb, testURL())
}

func newEnvAt(tb testing.TB, url string) *env {
	tb.Helper()
	e := openEnv(tb, url)
	tb.Cleanup(func() {
		if err := e.drop(); err != nil {
			tb.Error(err)
		}
	})
	return e
}

// openEnv is newEnvAt without the cleanup, for fixtures that outlive one
// test.
func openEnv(tb testing.TB, url string) *env {
	tb.Helper()
	e := &env{tb: tb, url: url, prefix: "t" + randomHex(4) + "_"}
	id, err := age.GenerateX25519Identity()
	if err != nil {
		tb.Fatal(err)
	}
	e.recipient = id.Recipient()
	e.idPath = filepath.Join(tb.TempDir(), "identity.txt")
	if err := os.WriteFile(e.idPath, []byte(id.String()+"\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e.admin, err = pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatalf("connect to the test PostgreSQL %s: %v (start it with pg_ctlcluster)", url, err)
	}
	return e
}

// drop removes every database owned by a role with the env's prefix, every
// such role, the roles the test made by hand and the generation row.
func (e *env) drop() error {
	ctx := context.Background()
	defer e.admin.Close(ctx)
	var errs []error
	rows, _ := e.admin.Query(ctx, `SELECT datname::text FROM pg_database WHERE starts_with(pg_get_userbyid(datdba)::text, $1)`, e.prefix)
	dbs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		errs = append(errs, fmt.Errorf("cleanup: list databases: %w", err))
	}
	for _, db := range dbs {
		if _, err := e.admin.Exec(ctx, "DROP DATABASE "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)"); err != nil {
			errs = append(errs, fmt.Errorf("cleanup: drop database %q: %w", db, err))
		}
	}
	rows, _ = e.admin.Query(ctx, `SELECT rolname::text FROM pg_roles WHERE starts_with(rolname::text, $1)`, e.prefix)
	roles, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		errs = append(errs, fmt.Errorf("cleanup: list roles: %w", err))
	}
	for _, r := range append(roles, e.extraRoles...) {
		if _, err := e.admin.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{r}.Sanitize()); err != nil {
			errs = append(errs, fmt.Errorf("cleanup: drop role %q: %w", r, err))
		}
	}
	var missing bool
	if err := e.admin.QueryRow(ctx, "SELECT to_regclass('steward.provision_generation') IS NULL").Scan(&missing); err != nil {
		errs = append(errs, err)
	}
	if !missing {
		if _, err := e.admin.Exec(ctx, `DELETE FROM steward.provision_generation WHERE prefix = $1`, e.prefix); err != nil {
			errs = append(errs, fmt.Errorf("cleanup: generation row: %w", err))
		}
	}
	return errors.Join(errs...)
}

// worker builds a Worker for this env's prefix; a nil tracer counts
// nothing.
func (e *env) worker(tracer pgx.QueryTracer) *Worker {
	e.tb.Helper()
	return e.workerWith(e.url, tracer)
}

func (e *env) workerWith(url string, tracer pgx.QueryTracer) *Worker {
	e.tb.Helper()
	w, err := newWorker(Config{Machine: testMachine, AgeIdentity: e.idPath, DatabaseURL: url, RolePrefix: e.prefix, ControllerKey: testControllerPub}, tracer)
	if err != nil {
		e.tb.Fatal(err)
	}
	e.tb.Cleanup(func() { _ = w.Close() })
	return w
}

func (e *env) encrypt(password string) string {
	e.tb.Helper()
	return encryptTo(e.tb, e.recipient, password)
}

func encryptTo(tb testing.TB, r age.Recipient, password string) string {
	tb.Helper()
	var buf bytes.Buffer
	aw := armor.NewWriter(&buf)
	w, err := age.Encrypt(aw, r)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := w.Write([]byte(password)); err != nil {
		tb.Fatal(err)
	}
	if err := w.Close(); err != nil {
		tb.Fatal(err)
	}
	if err := aw.Close(); err != nil {
		tb.Fatal(err)
	}
	return buf.String()
}

// giv is one consumer in a test grant, before encryption.
type giv struct{ node, db, password string }

// grant is a grant of this env's machine, signed by the test controller.
// A test that changes it afterwards signs it again (signGrant), so each
// case reaches the check it is about.
func (e *env) grant(gen uint64, gs ...giv) events.GrantChanged {
	e.tb.Helper()
	g := events.GrantChanged{Machine: testMachine, Requirement: "postgres", Generation: gen, Given: []events.Given{}}
	for _, c := range gs {
		g.Given = append(g.Given, events.Given{From: "test", Node: c.node, Values: events.GivenValues{Name: c.db}, Secret: e.encrypt(c.password)})
	}
	return signGrant(e.tb, g)
}

// The test controller key pair, committed on purpose: it signs the
// made-up grants of these tests and nothing else.
const (
	testControllerKey = "testdata/controller.key"
	testControllerPub = "testdata/controller.pub"
)

// signGrant is g with the test controller's envelope (any it held is
// replaced), as `steward publish --signing-key` sends it.
func signGrant(tb testing.TB, g events.GrantChanged) events.GrantChanged {
	tb.Helper()
	return signGrantWith(tb, testControllerKey, g)
}

// signGrantWith is g with an envelope by the private key at keyPath.
func signGrantWith(tb testing.TB, keyPath string, g events.GrantChanged) events.GrantChanged {
	tb.Helper()
	key, err := signing.LoadPrivateKey(keyPath)
	if err != nil {
		tb.Fatal(err)
	}
	out, err := signing.SignGrant(key, g)
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// db names a database inside this env, so cleanup and other tests never
// confuse it with anything else.
func (e *env) db(name string) string { return e.prefix + name }

func (e *env) role(node string) string { return e.prefix + node }

type roleRow struct {
	exists   bool
	canLogin bool
	verifier string
}

func (e *env) roleState(name string) roleRow {
	e.tb.Helper()
	var r roleRow
	err := e.admin.QueryRow(context.Background(), "SELECT rolcanlogin, coalesce(rolpassword, '') FROM pg_authid WHERE rolname = $1", name).Scan(&r.canLogin, &r.verifier)
	if errors.Is(err, pgx.ErrNoRows) {
		return r
	}
	if err != nil {
		e.tb.Fatal(err)
	}
	r.exists = true
	return r
}

// dbOwner returns the owner of database name, "" when it does not exist.
func (e *env) dbOwner(name string) string {
	e.tb.Helper()
	var owner string
	err := e.admin.QueryRow(context.Background(), "SELECT pg_get_userbyid(datdba)::text FROM pg_database WHERE datname = $1", name).Scan(&owner)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	if err != nil {
		e.tb.Fatal(err)
	}
	return owner
}

// hasDatabasePrivilege asks the server whether role (or "public") holds
// privilege on database.
func (e *env) hasDatabasePrivilege(role, database, privilege string) bool {
	e.tb.Helper()
	var ok bool
	if err := e.admin.QueryRow(context.Background(), "SELECT pg_catalog.has_database_privilege($1, $2, $3)", role, database, privilege).Scan(&ok); err != nil {
		e.tb.Fatalf("has_database_privilege(%s, %s, %s): %v", role, database, privilege, err)
	}
	return ok
}

// markedRoles lists the roles with this env's prefix, with their login.
func (e *env) markedRoles() map[string]roleRow {
	e.tb.Helper()
	rows, _ := e.admin.Query(context.Background(), "SELECT rolname::text, rolcanlogin, coalesce(rolpassword, '') FROM pg_authid WHERE starts_with(rolname::text, $1)", e.prefix)
	out := map[string]roleRow{}
	var (
		name string
		r    roleRow
	)
	r.exists = true
	if _, err := pgx.ForEachRow(rows, []any{&name, &r.canLogin, &r.verifier}, func() error { out[name] = r; return nil }); err != nil {
		e.tb.Fatal(err)
	}
	return out
}

func (e *env) appliedGeneration() int64 {
	e.tb.Helper()
	var g int64
	err := e.admin.QueryRow(context.Background(), "SELECT generation FROM steward.provision_generation WHERE machine = $1 AND prefix = $2", testMachine, e.prefix).Scan(&g)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		e.tb.Fatal(err)
	}
	return g
}

// apply reconciles g and fails unless it was applied.
func apply(tb testing.TB, w *Worker, g events.GrantChanged) *Applied {
	tb.Helper()
	res, err := w.reconcile(context.Background(), g)
	if err != nil {
		tb.Fatalf("generation %d: %v", g.Generation, err)
	}
	if res.applied == nil {
		tb.Fatalf("generation %d was not applied: skipped %+v", g.Generation, *res.skipped)
	}
	return res.applied
}

type sqlKey struct{}

// statements records the SQL a Worker sends; onEnd, when set, runs after
// each statement.
type statements struct {
	mu    sync.Mutex
	all   []string
	onEnd func(sql string)
}

func (s *statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	s.all = append(s.all, d.SQL)
	s.mu.Unlock()
	return context.WithValue(ctx, sqlKey{}, d.SQL)
}

func (s *statements) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if s.onEnd != nil {
		sql, _ := ctx.Value(sqlKey{}).(string)
		s.onEnd(sql)
	}
}

var ddlPattern = regexp.MustCompile(`(?i)^\s*(CREATE|ALTER|DROP|GRANT|REVOKE|COMMENT|REASSIGN|SECURITY|TRUNCATE)\b`)

var verifierInText = regexp.MustCompile(`SCRAM-SHA-256\$[^' ]*`)

// ddl returns the DDL statements sent since the last reset, verifiers
// blanked so a failure message shows none.
func (s *statements) ddl() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, q := range s.all {
		if ddlPattern.MatchString(q) {
			out = append(out, verifierInText.ReplaceAllString(q, "SCRAM-SHA-256$…"))
		}
	}
	return out
}

func (s *statements) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.all)
}

func (s *statements) reset() {
	s.mu.Lock()
	s.all = nil
	s.mu.Unlock()
}

func sameStrings(a, b []string) bool {
	return fmt.Sprint(a) == fmt.Sprint(b)
}

func assertNames(t testing.TB, what string, got, want []string) {
	t.Helper()
	if got == nil {
		got = []string{}
	}
	if want == nil {
		want = []string{}
	}
	if !sameStrings(got, want) {
		t.Errorf("%s = %q, want %q", what, got, want)
	}
}

// mustRecipient returns the recipient of a fresh identity nobody keeps:
// a secret encrypted to it is what an attacker without the machine's
// recipient would send.
func mustRecipient(tb testing.TB) *age.X25519Recipient {
	tb.Helper()
	id, err := age.GenerateX25519Identity()
	if err != nil {
		tb.Fatal(err)
	}
	return id.Recipient()
}
