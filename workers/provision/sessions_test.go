package provision

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers/workertest"
)

// loginAs opens a real session as the consumer's role, on the test
// server, with the granted password (a server that checks passwords needs
// it; the machine's trust server ignores it).
func (e *env) loginAs(node, password, database, application string) *pgx.Conn {
	e.tb.Helper()
	cfg, err := pgx.ParseConfig(e.url)
	if err != nil {
		e.tb.Fatal(err)
	}
	cfg.User, cfg.Password, cfg.Database = e.role(node), password, database
	cfg.RuntimeParams["application_name"] = application
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		e.tb.Fatalf("log in as %s to %s: %v", e.role(node), database, err)
	}
	e.tb.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func backendPID(t *testing.T, c *pgx.Conn) int32 {
	t.Helper()
	var pid int32
	if err := c.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// sessionsOf counts the server's sessions logged in as role.
func (e *env) sessionsOf(role string) int {
	e.tb.Helper()
	var n int
	if err := e.admin.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE usename = $1", role).Scan(&n); err != nil {
		e.tb.Fatal(err)
	}
	return n
}

// alive says a session still answers a query.
func alive(c *pgx.Conn) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := c.Exec(ctx, "SELECT 1")
	return err == nil
}

// TestRevocationEndsSessions logs in as two consumers, removes one from
// the grant, and checks the removed consumer's open session is ended
// within seconds (and said so in the outcome) while its database is kept
// and the other consumer's session lives on; then it rotates the remaining
// consumer's password and checks its open session is left alone.
func TestRevocationEndsSessions(t *testing.T) {
	e := newEnv(t)
	w := e.worker(nil)
	apply(t, w, e.grant(1, giv{"a", e.db("a"), "pa-1"}, giv{"b", e.db("b"), "pb-1"}))
	sa := e.loginAs("a", "pa-1", e.db("a"), "consumer-a")
	sb := e.loginAs("b", "pb-1", e.db("b"), "consumer-b")
	pidA := backendPID(t, sa)

	out := apply(t, w, e.grant(2, giv{"a", e.db("a"), "pa-1"}))
	assertNames(t, "revoked roles", out.Revoked.Roles, []string{e.role("b")})
	if out.SessionsEnded != 1 {
		t.Errorf("the revocation reports %d sessions ended, want 1", out.SessionsEnded)
	}
	workertest.WaitUntil(t, "the revoked consumer's session is ended", func() bool {
		return !alive(sb) && e.sessionsOf(e.role("b")) == 0
	})
	if owner := e.dbOwner(e.db("b")); owner != e.role("b") {
		t.Fatalf("the revoked consumer's database %s: owner %q, want it kept", e.db("b"), owner)
	}
	if !alive(sa) || backendPID(t, sa) != pidA {
		t.Fatal("the revocation of b ended the session of a, which is still granted")
	}

	// A rotation leaves the open session alone.
	out = apply(t, w, e.grant(3, giv{"a", e.db("a"), "pa-2"}))
	assertNames(t, "altered roles", out.Altered.Roles, []string{e.role("a")})
	if out.SessionsEnded != 0 || out.BlockingSessionsEnded != 0 {
		t.Fatalf("a rotation ended sessions: %+v", out)
	}
	if !alive(sa) || backendPID(t, sa) != pidA {
		t.Fatal("the password rotation ended the consumer's open session")
	}
	if !verifierMatches(e.roleState(e.role("a")).verifier, "pa-2") {
		t.Fatal("the rotation did not set the new password")
	}
}

// TestMarkedRoleWithPowersIsNormalised is the attack of issue 12 finding
// 4: a marked role made by hand with CREATEROLE, CREATEDB, and membership
// in pg_execute_server_program and in the superuser, is granted to a
// consumer. Logged in as that consumer, running a program on the server,
// becoming the superuser and handing itself the membership again must all
// be refused; the outcome says what was taken. A superuser marked role is
// normalised likewise.
func TestMarkedRoleWithPowersIsNormalised(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	me := currentUser(t, e)
	x, su := e.role("x"), e.role("su")
	for _, stmt := range []string{
		"CREATE ROLE " + pgx.Identifier{x}.Sanitize() + " NOLOGIN CREATEROLE CREATEDB",
		"GRANT pg_execute_server_program TO " + pgx.Identifier{x}.Sanitize(),
		"GRANT " + pgx.Identifier{me}.Sanitize() + " TO " + pgx.Identifier{x}.Sanitize(),
		"CREATE ROLE " + pgx.Identifier{su}.Sanitize() + " NOLOGIN SUPERUSER REPLICATION BYPASSRLS",
	} {
		if _, err := e.admin.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	w := e.worker(nil)
	out := apply(t, w, e.grant(1, giv{"x", e.db("x"), "px-1"}, giv{"su", e.db("su"), "psu-1"}))
	assertNames(t, "altered roles", out.Altered.Roles, []string{su, x})
	if len(out.Normalised) != 2 {
		t.Fatalf("normalised %+v, want su and x", out.Normalised)
	}
	for _, n := range out.Normalised {
		switch n.Role {
		case x:
			assertNames(t, "x's attributes taken", n.Attributes, []string{"CREATEDB", "CREATEROLE"})
			want := []string{me, "pg_execute_server_program"}
			if me > "pg_execute_server_program" {
				want = []string{"pg_execute_server_program", me}
			}
			assertNames(t, "x's memberships taken", n.Memberships, want)
		case su:
			assertNames(t, "su's attributes taken", n.Attributes, []string{"SUPERUSER", "REPLICATION", "BYPASSRLS"})
			assertNames(t, "su's memberships taken", n.Memberships, nil)
		default:
			t.Errorf("normalised a role nobody gave powers: %+v", n)
		}
	}

	denied := func(c *pgx.Conn, what, stmt string) {
		t.Helper()
		_, err := c.Exec(ctx, stmt)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "42501" {
			t.Errorf("as the consumer, %s (%s): %v, want permission denied (42501)", what, stmt, err)
		}
	}
	for _, c := range []struct{ node, password string }{{"x", "px-1"}, {"su", "psu-1"}} {
		s := e.loginAs(c.node, c.password, e.db(c.node), "consumer-"+c.node)
		denied(s, "run a program as the server's user", "COPY (SELECT 1) TO PROGRAM 'true'")
		denied(s, "become the superuser", "SET ROLE "+pgx.Identifier{me}.Sanitize())
		denied(s, "grant itself pg_execute_server_program", "GRANT pg_execute_server_program TO "+pgx.Identifier{e.role(c.node)}.Sanitize())
		denied(s, "create a role", "CREATE ROLE "+pgx.Identifier{e.role("made")}.Sanitize())
		denied(s, "create a database", "CREATE DATABASE "+pgx.Identifier{e.db("made")}.Sanitize())
		var super string
		if err := s.QueryRow(ctx, "SHOW is_superuser").Scan(&super); err != nil || super != "off" {
			t.Errorf("consumer %s: is_superuser %q, %v", c.node, super, err)
		}
	}

	// Normalised once, the next run has nothing to take and sends no DDL.
	st := &statements{}
	w2 := e.worker(st)
	out = apply(t, w2, e.grant(2, giv{"x", e.db("x"), "px-1"}, giv{"su", e.db("su"), "psu-1"}))
	if len(out.Normalised) != 0 || len(st.ddl()) != 0 {
		t.Fatalf("the second run normalised %+v and sent %q", out.Normalised, st.ddl())
	}

	// An orphan is normalised too: a NOLOGIN role with powers can still be
	// taken on with SET ROLE by its members.
	if _, err := e.admin.Exec(ctx, "ALTER ROLE "+pgx.Identifier{su}.Sanitize()+" CREATEROLE"); err != nil {
		t.Fatal(err)
	}
	out = apply(t, w2, e.grant(3, giv{"x", e.db("x"), "px-1"}))
	assertNames(t, "revoked roles", out.Revoked.Roles, []string{su})
	if len(out.Normalised) != 1 || out.Normalised[0].Role != su {
		t.Fatalf("the orphan was not normalised: %+v", out.Normalised)
	}
	var createrole bool
	if err := e.admin.QueryRow(ctx, "SELECT rolcreaterole FROM pg_roles WHERE rolname = $1", su).Scan(&createrole); err != nil || createrole {
		t.Fatalf("the orphan %s keeps CREATEROLE: %v, %v", su, createrole, err)
	}
}

// TestConsumerCannotStallProvisioning is the attack of issue 12 finding 8:
// granted consumers do whatever they can to hold the provisioner off (the
// old advisory lock key, session and transaction advisory locks on the
// schema key, locking Steward's tables, a lock on the table by OID, a
// session idling in template1, an uncommitted ALTER ROLE on itself), and
// the next grant, which revokes one of them and creates a database, still
// applies within seconds.
func TestConsumerCannotStallProvisioning(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	w := e.worker(nil)
	w.lockTimeout = 500 * time.Millisecond
	apply(t, w, e.grant(1, giv{"a", e.db("a"), "pa-1"}, giv{"b", e.db("b"), "pb-1"}))

	// Advisory locks and Steward's tables belong to the database the
	// provisioner connects to, which every role may connect to.
	cfg, err := pgx.ParseConfig(e.url)
	if err != nil {
		t.Fatal(err)
	}
	home := cfg.Database
	sa := e.loginAs("a", "pa-1", home, "attacker-a")
	oldKey := "steward.provision/" + testMachine + "/" + e.prefix
	for _, stmt := range []string{
		"SELECT pg_advisory_lock(hashtextextended('" + oldKey + "', 0))",
		"SELECT pg_advisory_lock(hashtextextended('steward.schema', 0))",
		"BEGIN",
		"SELECT pg_advisory_xact_lock(hashtextextended('steward.schema', 0))",
		"SELECT pg_relation_size(" + oidOf(t, e, lockIdent()) + ")",
		"SELECT pg_relation_size(" + oidOf(t, e, generationIdent()) + ")",
	} {
		if _, err := sa.Exec(ctx, stmt); err != nil {
			t.Fatalf("as consumer a, %s: %v", stmt, err)
		}
	}
	// What a consumer cannot do at all.
	for _, stmt := range []string{
		"BEGIN; LOCK TABLE " + lockIdent() + " IN ACCESS EXCLUSIVE MODE",
		"SELECT 1 FROM " + lockIdent() + " FOR UPDATE",
		"SELECT 1 FROM " + generationIdent() + " FOR UPDATE",
	} {
		probe := e.loginAs("a", "pa-1", home, "attacker-a-probe")
		_, err := probe.Exec(ctx, stmt)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "42501" {
			t.Fatalf("as consumer a, %s: %v, want permission denied", stmt, err)
		}
	}
	// b idles in template1 and holds its own catalog row.
	e.loginAs("b", "pb-1", "template1", "attacker-b-template1")
	sb := e.loginAs("b", "pb-1", e.db("b"), "attacker-b")
	v, err := newVerifier("pb-self")
	if err != nil {
		t.Fatal(err)
	}
	lit, _ := verifierLiteral(v)
	for _, stmt := range []string{"BEGIN", "ALTER ROLE " + pgx.Identifier{e.role("b")}.Sanitize() + " PASSWORD " + lit} {
		if _, err := sb.Exec(ctx, stmt); err != nil {
			t.Fatalf("as consumer b: %v", err)
		}
	}

	done := make(chan struct{})
	var (
		out    *Applied
		recErr error
	)
	start := time.Now()
	go func() {
		defer close(done)
		res, err := w.reconcile(ctx, e.grant(2, giv{"a", e.db("a"), "pa-2"}, giv{"c", e.db("c"), "pc-1"}))
		out, recErr = res.applied, err
	}()
	workertest.WaitUntil(t, "the grant is reconciled despite the consumers", func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	})
	if recErr != nil || out == nil {
		t.Fatalf("the grant did not apply: %v", recErr)
	}
	t.Logf("applied in %v past the consumers' locks", time.Since(start).Round(time.Millisecond))
	assertNames(t, "revoked roles", out.Revoked.Roles, []string{e.role("b")})
	assertNames(t, "created databases", out.Created.Databases, []string{e.db("c")})
	assertNames(t, "altered roles", out.Altered.Roles, []string{e.role("a")})
	if out.BlockingSessionsEnded != 1 || out.SessionsEnded != 1 {
		t.Errorf("blocking sessions ended %d (want 1: b's uncommitted ALTER ROLE), sessions ended %d (want 1: b in template1)", out.BlockingSessionsEnded, out.SessionsEnded)
	}
	if r := e.roleState(e.role("b")); r.canLogin || verifierMatches(r.verifier, "pb-self") {
		t.Fatalf("b: %+v; its own password change was not undone or its login kept", r)
	}
	if e.sessionsOf(e.role("b")) != 0 {
		t.Fatal("a session of the revoked consumer b still runs")
	}
	if !verifierMatches(e.roleState(e.role("a")).verifier, "pa-2") || e.appliedGeneration() != 2 {
		t.Fatal("the grant's rotation of a or its generation was not recorded")
	}
	if !alive(sa) {
		t.Fatal("the session of a, which is still granted, was ended")
	}
}

func oidOf(t *testing.T, e *env, ident string) string {
	t.Helper()
	var oid string
	if err := e.admin.QueryRow(context.Background(), "SELECT $1::regclass::oid::text", ident).Scan(&oid); err != nil {
		t.Fatal(err)
	}
	return oid
}

// TestLockHeldIsRetryable holds this machine's lock row from another
// session, as a second worker would, and checks the reconcile gives up
// after the lock timeout with a retryable error that names the holder and
// the generation, then applies once the lock is free.
func TestLockHeldIsRetryable(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	w := e.worker(nil)
	w.lockTimeout = 300 * time.Millisecond
	apply(t, w, e.grant(1, giv{"a", e.db("a"), "pa-1"}))

	cfg, err := pgx.ParseConfig(e.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = "other-provisioner"
	other, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+lockIdent()+" WHERE machine = $1 AND prefix = $2 FOR UPDATE", testMachine, e.prefix); err != nil {
		t.Fatal(err)
	}
	var pid int32
	if err := other.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	res := workertest.NewRunner(t, w.Spec(), w).WorkData(events.TypeGrantChanged, testMachine, e.grant(2, giv{"a", e.db("a"), "pa-2"}))
	// Retried, and nothing emitted while it waits for the lock.
	res.AssertVerdicts(workertest.Retried)
	res.AssertOutcomes()
	err = res.Err()
	var r *refusal
	if err == nil || errors.As(err, &r) || !isLockTimeout(err) {
		t.Fatalf("got %v, want a retryable lock timeout", err)
	}
	for _, want := range []string{"other-provisioner", "generation 2", "machine " + testMachine, "session " + strconv.Itoa(int(pid))} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
	if e.appliedGeneration() != 1 {
		t.Fatalf("a grant that waits for the lock moved the generation to %d", e.appliedGeneration())
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	apply(t, w, e.grant(2, giv{"a", e.db("a"), "pa-2"}))
}
