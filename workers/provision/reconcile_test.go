package provision

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// TestLifecycle creates two consumers, rotates one password, removes a
// consumer, grants it again and finally grants nobody, checking after each
// step the server's roles, logins, verifiers and databases, the DDL sent,
// and that roles without the mark are left exactly as they were.
func TestLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	// Two roles made by hand: one unrelated, one that only nearly carries
	// the mark (the prefix without its last character).
	hand := "h" + randomHex(4) + "_hand"
	nearMiss := strings.TrimSuffix(e.prefix, "_") + "-hand"
	e.extraRoles = append(e.extraRoles, hand, nearMiss)
	for _, r := range []string{hand, nearMiss} {
		v, err := newVerifier("hand-made-password")
		if err != nil {
			t.Fatal(err)
		}
		lit, _ := verifierLiteral(v)
		if _, err := e.admin.Exec(ctx, "CREATE ROLE "+pgx.Identifier{r}.Sanitize()+" LOGIN PASSWORD "+lit); err != nil {
			t.Fatal(err)
		}
	}
	handBefore, nearBefore := e.roleState(hand), e.roleState(nearMiss)
	handSurvives := func(step string) {
		t.Helper()
		if got := e.roleState(hand); got != handBefore {
			t.Errorf("%s: the hand-made role %s changed: %+v, was %+v", step, hand, got, handBefore)
		}
		if got := e.roleState(nearMiss); got != nearBefore {
			t.Errorf("%s: the hand-made role %s changed: %+v, was %+v", step, nearMiss, got, nearBefore)
		}
	}
	ra, rb, da, db := e.role("a"), e.role("b"), e.db("a"), e.db("b")
	st := &statements{}
	w := e.worker(st)

	// Create: per consumer, by node, its role, its database and the
	// revocation of PUBLIC's privileges on it.
	out := apply(t, w, e.grant(1, giv{"b", db, "pb-1"}, giv{"a", da, "pa-1"}))
	assertNames(t, "created roles", out.Created.Roles, []string{ra, rb})
	assertNames(t, "created databases", out.Created.Databases, []string{da, db})
	assertNames(t, "altered databases", out.Altered.Databases, nil)
	var created []string
	for _, q := range st.ddl() {
		// The generation table is made only on a server that lacks it.
		if !strings.Contains(q, " IF NOT EXISTS ") {
			created = append(created, q)
		}
	}
	wantDDL := []string{
		"CREATE ROLE " + pgx.Identifier{ra}.Sanitize() + " WITH ",
		"CREATE DATABASE " + pgx.Identifier{da}.Sanitize() + " OWNER " + pgx.Identifier{ra}.Sanitize(),
		"REVOKE ALL ON DATABASE " + pgx.Identifier{da}.Sanitize() + " FROM PUBLIC",
		"CREATE ROLE " + pgx.Identifier{rb}.Sanitize() + " WITH ",
		"CREATE DATABASE " + pgx.Identifier{db}.Sanitize() + " OWNER " + pgx.Identifier{rb}.Sanitize(),
		"REVOKE ALL ON DATABASE " + pgx.Identifier{db}.Sanitize() + " FROM PUBLIC",
	}
	if len(created) != len(wantDDL) {
		t.Fatalf("creation sent %q, want %d statements: %q", created, len(wantDDL), wantDDL)
	}
	for i, want := range wantDDL {
		if !strings.HasPrefix(created[i], want) {
			t.Fatalf("creation statement %d is %q, want %q...", i, created[i], want)
		}
	}
	// Each database is its owner's alone: the other consumer, a role made
	// by hand and PUBLIC cannot connect to it or make temporary tables.
	for _, c := range []struct{ database, owner, other string }{{da, ra, rb}, {db, rb, ra}} {
		if !e.hasDatabasePrivilege(c.owner, c.database, "CONNECT") {
			t.Fatalf("the owner %s cannot connect to its database %s", c.owner, c.database)
		}
		for _, who := range []string{c.other, hand, "public"} {
			for _, priv := range []string{"CONNECT", "TEMPORARY"} {
				if e.hasDatabasePrivilege(who, c.database, priv) {
					t.Fatalf("%s has %s on %s, the database of %s", who, priv, c.database, c.owner)
				}
			}
		}
	}
	for node, pw := range map[string]string{"a": "pa-1", "b": "pb-1"} {
		r := e.roleState(e.role(node))
		if !r.exists || !r.canLogin || !verifierMatches(r.verifier, pw) {
			t.Fatalf("role %s after creation: %+v (matches its password: %v)", e.role(node), r, verifierMatches(r.verifier, pw))
		}
		if owner := e.dbOwner(e.db(node)); owner != e.role(node) {
			t.Fatalf("database %s is owned by %q, want %s", e.db(node), owner, e.role(node))
		}
	}
	if e.appliedGeneration() != 1 {
		t.Fatalf("applied generation %d, want 1", e.appliedGeneration())
	}
	handSurvives("create")

	// Rotate a's password: one ALTER, b untouched.
	st.reset()
	out = apply(t, w, e.grant(2, giv{"a", da, "pa-2"}, giv{"b", db, "pb-1"}))
	assertNames(t, "altered roles", out.Altered.Roles, []string{ra})
	assertNames(t, "unchanged roles", out.Unchanged.Roles, []string{rb})
	assertNames(t, "unchanged databases", out.Unchanged.Databases, []string{da, db})
	assertNames(t, "created roles", out.Created.Roles, nil)
	if v := e.roleState(ra).verifier; !verifierMatches(v, "pa-2") || verifierMatches(v, "pa-1") {
		t.Fatalf("after rotation the verifier of %s matches the new password: %v, the old: %v", ra, verifierMatches(v, "pa-2"), verifierMatches(v, "pa-1"))
	}
	if ddl := st.ddl(); len(ddl) != 1 || !strings.HasPrefix(ddl[0], "ALTER ROLE ") || !strings.Contains(ddl[0], "PASSWORD") {
		t.Fatalf("rotation sent %q, want one ALTER ROLE ... PASSWORD", ddl)
	}
	handSurvives("rotate")

	// Remove b: NOLOGIN, never dropped, its database stays.
	st.reset()
	out = apply(t, w, e.grant(3, giv{"a", da, "pa-2"}))
	assertNames(t, "revoked roles", out.Revoked.Roles, []string{rb})
	assertNames(t, "unchanged roles", out.Unchanged.Roles, []string{ra})
	if r := e.roleState(rb); !r.exists || r.canLogin {
		t.Fatalf("removed role %s: %+v, want it kept with NOLOGIN", rb, r)
	}
	if owner := e.dbOwner(db); owner != rb {
		t.Fatalf("the removed consumer's database %s: owner %q, want it kept and owned by %s", db, owner, rb)
	}
	if ddl := st.ddl(); len(ddl) != 1 || !strings.HasSuffix(ddl[0], "NOLOGIN") {
		t.Fatalf("removal sent %q, want one ALTER ROLE ... NOLOGIN", ddl)
	}
	handSurvives("remove")

	// Re-grant b with its old password: LOGIN again, no new password.
	st.reset()
	out = apply(t, w, e.grant(4, giv{"a", da, "pa-2"}, giv{"b", db, "pb-1"}))
	assertNames(t, "altered roles", out.Altered.Roles, []string{rb})
	assertNames(t, "unchanged databases", out.Unchanged.Databases, []string{da, db})
	if r := e.roleState(rb); !r.canLogin || !verifierMatches(r.verifier, "pb-1") {
		t.Fatalf("re-granted role %s: %+v", rb, r)
	}
	if ddl := st.ddl(); len(ddl) != 1 || strings.Contains(ddl[0], "PASSWORD") || !strings.HasSuffix(ddl[0], "WITH LOGIN") {
		t.Fatalf("re-grant sent %q, want one ALTER ROLE ... WITH LOGIN", ddl)
	}
	handSurvives("re-grant")

	// Grant nobody: every marked role loses its login.
	out = apply(t, w, e.grant(5))
	assertNames(t, "revoked roles", out.Revoked.Roles, []string{ra, rb})
	for name, r := range e.markedRoles() {
		if r.canLogin {
			t.Errorf("role %s can still log in after an empty grant", name)
		}
	}
	handSurvives("empty grant")
}

// TestStaleGenerationChangesNothing redelivers older and equal generations
// after a newer one, through the same worker and through a second worker
// with its own pool (another process), and checks nothing changes.
func TestStaleGenerationChangesNothing(t *testing.T) {
	e := newEnv(t)
	st := &statements{}
	w := e.worker(st)
	apply(t, w, e.grant(5, giv{"a", e.db("a"), "p-5"}))
	before := e.markedRoles()

	other := &statements{}
	w2 := e.worker(other)
	for _, c := range []struct {
		what string
		w    *Worker
		gen  uint64
	}{
		{"older generation, same worker", w, 4},
		{"same generation redelivered", w, 5},
		{"older generation, another worker", w2, 3},
	} {
		st.reset()
		other.reset()
		res, err := c.w.reconcile(context.Background(), e.grant(c.gen, giv{"a", e.db("a"), "p-old"}, giv{"b", e.db("b"), "p-old"}))
		if err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		if res.skipped == nil || res.skipped.Applied != 5 || res.skipped.Generation != c.gen {
			t.Fatalf("%s: got %+v, want skipped below applied generation 5", c.what, res)
		}
		if ddl := append(st.ddl(), other.ddl()...); len(ddl) != 0 {
			t.Fatalf("%s sent DDL %q", c.what, ddl)
		}
		after := e.markedRoles()
		if len(after) != len(before) || after[e.role("a")] != before[e.role("a")] {
			t.Fatalf("%s changed the roles: %+v, were %+v", c.what, after, before)
		}
		if e.dbOwner(e.db("b")) != "" {
			t.Fatalf("%s created database %s", c.what, e.db("b"))
		}
		if g := e.appliedGeneration(); g != 5 {
			t.Fatalf("%s moved the applied generation to %d", c.what, g)
		}
	}
	if v := e.roleState(e.role("a")).verifier; !verifierMatches(v, "p-5") {
		t.Fatal("the stale generations changed the password of a")
	}
	// A newer generation still applies, through either worker.
	apply(t, w2, e.grant(6, giv{"a", e.db("a"), "p-6"}))
	if v := e.roleState(e.role("a")).verifier; !verifierMatches(v, "p-6") {
		t.Fatal("generation 6 did not set the password of a")
	}
}

// TestRefusalChangesNothing sends grants that hold one valid change and one
// refused consumer, and checks the valid change was not made either.
func TestRefusalChangesNothing(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	st := &statements{}
	w := e.worker(st)
	apply(t, w, e.grant(1, giv{"a", e.db("a"), "p-1"}))
	before := e.markedRoles()

	// A database that exists and belongs to somebody else.
	taken := e.db("taken")
	if _, err := e.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{taken}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := e.admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{taken}.Sanitize()); err != nil {
			t.Errorf("drop %s: %v", taken, err)
		}
	})
	other := encryptTo(t, mustRecipient(t), "p-2")

	cases := []struct {
		rule  string
		grant func() []giv
		patch func(i int, secret *string)
	}{
		{rule: "database-owner", grant: func() []giv { return []giv{{"a", e.db("a"), "p-2"}, {"b", taken, "p-b"}} }},
		{rule: "secret-undecryptable", grant: func() []giv { return []giv{{"a", e.db("a"), "p-2"}, {"b", e.db("b"), "p-b"}} },
			patch: func(i int, s *string) {
				if i == 1 {
					*s = other
				}
			}},
		{rule: "secret-missing", grant: func() []giv { return []giv{{"a", e.db("a"), "p-2"}, {"b", e.db("b"), "p-b"}} },
			patch: func(i int, s *string) {
				if i == 1 {
					*s = ""
				}
			}},
	}
	for _, c := range cases {
		st.reset()
		g := e.grant(2, c.grant()...)
		for i := range g.Given {
			if c.patch != nil {
				c.patch(i, &g.Given[i].Secret)
			}
		}
		g = signGrant(t, g)
		_, err := w.reconcile(ctx, g)
		var r *refusal
		if !errors.As(err, &r) || r.Rule != c.rule {
			t.Fatalf("%s: got %v, want a refusal by rule %s", c.rule, err, c.rule)
		}
		if workers.IsPermanent(err) {
			t.Fatalf("%s: reconcile itself marks nothing permanent; Handle does", c.rule)
		}
		if ddl := st.ddl(); len(ddl) != 0 {
			t.Fatalf("%s: refused grant sent DDL %q", c.rule, ddl)
		}
		after := e.markedRoles()
		if len(after) != len(before) {
			t.Fatalf("%s: roles %v, were %v", c.rule, after, before)
		}
		for name, r := range before {
			if after[name] != r {
				t.Fatalf("%s: role %s changed", c.rule, name)
			}
		}
		if e.appliedGeneration() != 1 {
			t.Fatalf("%s: applied generation moved to %d", c.rule, e.appliedGeneration())
		}
		if e.dbOwner(taken) != "postgres" && e.dbOwner(taken) != currentUser(t, e) {
			t.Fatalf("%s: database %s changed owner to %q", c.rule, taken, e.dbOwner(taken))
		}
	}
}

func currentUser(t *testing.T, e *env) string {
	t.Helper()
	var u string
	if err := e.admin.QueryRow(context.Background(), "SELECT current_user").Scan(&u); err != nil {
		t.Fatal(err)
	}
	return u
}

// TestRoleOfStewardIsRefused uses a mark under which the connecting user
// itself would be granted, and checks the grant is refused.
func TestRoleOfStewardIsRefused(t *testing.T) {
	e := newEnv(t)
	me := currentUser(t, e)
	if len(me) < 2 || !prefixPattern.MatchString(me[:len(me)-1]) {
		t.Fatalf("the test user %q cannot be split into a mark and a node", me)
	}
	w, err := newWorker(Config{Machine: testMachine, AgeIdentity: e.idPath, DatabaseURL: e.url, RolePrefix: me[:len(me)-1], ControllerKey: testControllerPub}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	_, err = w.reconcile(context.Background(), e.grant(1, giv{me[len(me)-1:], e.db("x"), "p"}))
	var r *refusal
	if !errors.As(err, &r) || r.Rule != "role-is-steward" {
		t.Fatalf("got %v, want a refusal by rule role-is-steward", err)
	}
}

// TestHalfAppliedGrantCompletes stops a reconcile after its first CREATE
// DATABASE, as a crash would, and checks that running the same generation
// again completes it and only then records it.
func TestHalfAppliedGrantCompletes(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := &statements{}
	st.onEnd = func(sql string) {
		if strings.HasPrefix(sql, "CREATE DATABASE") {
			cancel()
		}
	}
	w := e.worker(st)
	g := e.grant(1, giv{"a", e.db("a"), "p-a"}, giv{"b", e.db("b"), "p-b"})
	_, err := w.reconcile(ctx, g)
	var r *refusal
	if err == nil || errors.As(err, &r) {
		t.Fatalf("an interrupted reconcile returned %v, want a retryable error", err)
	}
	if e.dbOwner(e.db("a")) != e.role("a") || e.roleState(e.role("b")).exists {
		t.Fatalf("the interruption did not land after the first database: a's owner %q, b exists %v", e.dbOwner(e.db("a")), e.roleState(e.role("b")).exists)
	}
	if e.appliedGeneration() != 0 {
		t.Fatal("a half-applied generation was recorded as applied")
	}

	// The crash fell between a's CREATE DATABASE and its REVOKE: PUBLIC,
	// so every role, may still connect to it.
	if !e.hasDatabasePrivilege("public", e.db("a"), "CONNECT") {
		t.Fatal("the interruption did not land before the REVOKE on a's database")
	}

	st.onEnd = nil
	st.reset()
	out := apply(t, w, g)
	assertNames(t, "created roles", out.Created.Roles, []string{e.role("b")})
	assertNames(t, "created databases", out.Created.Databases, []string{e.db("b")})
	assertNames(t, "unchanged roles", out.Unchanged.Roles, []string{e.role("a")})
	assertNames(t, "altered databases", out.Altered.Databases, []string{e.db("a")})
	assertNames(t, "unchanged databases", out.Unchanged.Databases, nil)
	if e.appliedGeneration() != 1 || e.dbOwner(e.db("b")) != e.role("b") {
		t.Fatalf("the redelivery did not complete generation 1")
	}
	for _, node := range []string{"a", "b"} {
		if e.hasDatabasePrivilege("public", e.db(node), "CONNECT") || !e.hasDatabasePrivilege(e.role(node), e.db(node), "CONNECT") {
			t.Fatalf("after the redelivery database %s is not its owner's alone", e.db(node))
		}
	}
	if e.hasDatabasePrivilege(e.role("b"), e.db("a"), "CONNECT") {
		t.Fatalf("%s can connect to the database of a", e.role("b"))
	}

	// Completed, the next generation sends no DDL at all.
	st.reset()
	out = apply(t, w, e.grant(2, giv{"a", e.db("a"), "p-a"}, giv{"b", e.db("b"), "p-b"}))
	if ddl := st.ddl(); len(ddl) != 0 {
		t.Fatalf("a no-op reconcile after the completion sent %q", ddl)
	}
	assertNames(t, "unchanged databases", out.Unchanged.Databases, []string{e.db("a"), e.db("b")})
}

// TestDatabaseDownIsRetried points a worker at a port nobody listens on:
// the grant fails with an error that is retried (not permanent), and no
// outcome is emitted.
func TestDatabaseDownIsRetried(t *testing.T) {
	e := newEnv(t)
	w := e.workerWith("postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=2", nil)
	res := workertest.NewRunner(t, w.Spec(), w).WorkData(events.TypeGrantChanged, testMachine, e.grant(1, giv{"a", e.db("a"), "p"}))
	// Retried, and nothing emitted for a grant that will be retried.
	res.AssertVerdicts(workertest.Retried)
	res.AssertOutcomes()
	res.AssertDeadLetters()
	err := res.Err()
	var r *refusal
	if err == nil || errors.As(err, &r) || workers.IsPermanent(err) {
		t.Fatalf("got %v, want a retryable error", err)
	}
	if !strings.Contains(err.Error(), "unreachable") || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("the error does not say which server is unreachable: %v", err)
	}
}
