package provision

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/steward-dev/steward/events"
)

// The applied generation lives in the database server itself, in a table
// in Steward's own schema, keyed by machine and mark prefix. The server is
// the state being reconciled, so the generation that describes it belongs
// beside it: every worker process that provisions this server, whatever
// NATS it hears from and whatever its KV bucket holds, reads the same row
// under the same lock, so an older generation is never applied over a
// newer one even across workers. It is written only after a reconcile
// completes, so a grant that half-applied before a crash is not "applied"
// and its redelivery runs it again to the end.
//
// The lock is a row lock (SELECT ... FOR UPDATE) on provision_lock, in the
// same schema. Only its owner and superusers can lock that row: every role
// on the server, so every granted consumer, may take any advisory lock, and
// a consumer holding the old session-level advisory key stalled provisioning
// for ever, its own revocation included.
const (
	generationSchema = "steward"
	generationTable  = "provision_generation"
	lockTable        = "provision_lock"
)

// Default bounds on the provisioner's statements. A lock wait longer than
// defaultLockTimeout is a retryable error naming the holder, never a wait
// without end; defaultStatementTimeout bounds every statement, including a
// CREATE DATABASE.
const (
	defaultLockTimeout      = 5 * time.Second
	defaultStatementTimeout = 2 * time.Minute
	// terminateWait is how long pg_terminate_backend waits for a session
	// to exit before the reconcile calls it still running.
	terminateWait = 5 * time.Second
	// roleLockAttempts bounds how often a role statement is retried after
	// ending the role's own sessions that held its catalog row.
	roleLockAttempts = 3
)

// result is what a reconcile did: exactly one of the two is set.
type result struct {
	applied *Applied
	skipped *Skipped
}

// membership is one role a marked role is a member of, and who granted it.
type membership struct {
	role    string
	grantor string // "" when the grantor role no longer exists
}

// roleState is a marked role as the server has it.
type roleState struct {
	exists   bool
	canLogin bool
	password string // rolpassword: a verifier, an md5 hash or ""
	// powers are the attributes set that a consumer's role never holds
	// (SUPERUSER, CREATEDB, CREATEROLE, REPLICATION, BYPASSRLS).
	powers []string
	// memberships are every role it is a member of: the provisioner grants
	// none, so each was granted by somebody else.
	memberships []membership
}

// reconcile makes the server match grant g. It returns a *refusal when g
// is refused (nothing changed), any other error when a retry may succeed.
func (w *Worker) reconcile(ctx context.Context, g events.GrantChanged) (result, error) {
	if r := w.checkGrant(g); r != nil {
		return result{}, r
	}
	// One reconcile at a time per process, so two never wait on each
	// other for the pool's connections.
	select {
	case w.running <- struct{}{}:
		defer func() { <-w.running }()
	case <-ctx.Done():
		return result{}, ctx.Err()
	}
	lockConn, err := w.pool.Acquire(ctx)
	if err != nil {
		return result{}, fmt.Errorf("%s is unreachable, so generation %d waits for it: %w", w.dbTarget, g.Generation, err)
	}
	defer lockConn.Release()
	conn, err := w.pool.Acquire(ctx)
	if err != nil {
		return result{}, fmt.Errorf("%s is unreachable, so generation %d waits for it: %w", w.dbTarget, g.Generation, err)
	}
	defer conn.Release()
	// Session settings, so every statement of the work connection is
	// bounded: a lock a consumer holds becomes a retryable error rather
	// than a reconcile that never ends.
	if _, err := conn.Exec(ctx, fmt.Sprintf("SET lock_timeout = %d; SET statement_timeout = %d",
		w.lockTimeout.Milliseconds(), w.statementTimeout.Milliseconds())); err != nil {
		return result{}, fmt.Errorf("set the timeouts of generation %d on %s: %w", g.Generation, w.dbTarget, err)
	}
	if err := w.ensureTable(ctx, conn.Conn()); err != nil {
		return result{}, err
	}

	lock, err := w.lock(ctx, lockConn.Conn(), g)
	if err != nil {
		return result{}, err
	}
	// Rolled back unless committed below with the generation: either way
	// the row lock ends with the transaction.
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if rerr := lock.Rollback(rctx); rerr != nil && !errors.Is(rerr, pgx.ErrTxClosed) {
			// Closing the session is what ends its transaction for sure.
			_ = lockConn.Conn().Close(context.Background())
		}
	}()

	var applied int64
	err = lock.QueryRow(ctx, "SELECT generation FROM "+generationIdent()+" WHERE machine = $1 AND prefix = $2", w.machine, w.prefix).Scan(&applied)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		// The table may have been dropped by hand: look again next time.
		w.tableReady.Store(false)
		return result{}, fmt.Errorf("read the applied generation of machine %s: %w", w.machine, err)
	}
	if g.Generation <= uint64(applied) {
		return result{skipped: &Skipped{Machine: w.machine, Generation: g.Generation, Applied: uint64(applied)}}, nil
	}

	consumers, ref := w.plan(g)
	if ref != nil {
		return result{}, ref
	}
	me, roles, dbs, err := w.readState(ctx, conn.Conn(), consumers)
	if err != nil {
		return result{}, err
	}
	if ref := w.checkState(g, consumers, me, dbs); ref != nil {
		return result{}, ref
	}

	current := passwordsCurrent(consumers, roles)
	out := &Applied{Machine: w.machine, Generation: g.Generation,
		Created: newNames(), Altered: newNames(), Revoked: newNames(), Unchanged: newNames(),
		Normalised: []Normalised{}}
	granted := make(map[string]bool, len(consumers))
	for i, c := range consumers {
		granted[c.role] = true
		if err := w.applyRole(ctx, conn.Conn(), g, c, roles[c.role], current[i], out); err != nil {
			return result{}, err
		}
		db, exists := dbs[c.database]
		switch {
		case exists && !db.defaultACL:
			out.Unchanged.Databases = append(out.Unchanged.Databases, c.database)
			continue
		case exists:
			// Its privileges were never set: the reconcile that created it
			// stopped before closing it to PUBLIC. Finish that creation.
			out.Altered.Databases = append(out.Altered.Databases, c.database)
		default:
			// From template0, which nobody can connect to: CREATE DATABASE
			// fails while any session is connected to its template, and
			// every role may connect to template1, so a consumer idling
			// there would stall every later creation.
			stmt := "CREATE DATABASE " + pgx.Identifier{c.database}.Sanitize() + " OWNER " + pgx.Identifier{c.role}.Sanitize() + " TEMPLATE template0"
			if _, err := conn.Exec(ctx, stmt); err != nil {
				return result{}, fmt.Errorf("create database %q for role %q (generation %d): %w", c.database, c.role, g.Generation, err)
			}
			out.Created.Databases = append(out.Created.Databases, c.database)
		}
		// A new database lets PUBLIC, so every role on the server, connect
		// and make temporary tables; a consumer's database is its owner's
		// alone.
		if _, err := conn.Exec(ctx, "REVOKE ALL ON DATABASE "+pgx.Identifier{c.database}.Sanitize()+" FROM PUBLIC"); err != nil {
			return result{}, fmt.Errorf("revoke PUBLIC's privileges on database %q of role %q (generation %d): %w", c.database, c.role, g.Generation, err)
		}
	}

	// Orphans lose their login and their powers but keep what they own:
	// whether their databases go is somebody's decision, not a
	// reconcile's.
	names := make([]string, 0, len(roles))
	for name := range roles {
		names = append(names, name)
	}
	slices.Sort(names)
	var orphans []string
	for _, name := range names {
		if granted[name] || name == me {
			continue
		}
		orphans = append(orphans, name)
		st := roles[name]
		clauses, err := w.normalise(ctx, conn.Conn(), g, name, st, out)
		if err != nil {
			return result{}, err
		}
		if st.canLogin {
			clauses = append(clauses, "NOLOGIN")
		}
		if len(clauses) == 0 {
			continue
		}
		if err := w.roleExec(ctx, conn.Conn(), g, name, "ALTER ROLE "+pgx.Identifier{name}.Sanitize()+" WITH "+strings.Join(clauses, " "), out); err != nil {
			return result{}, fmt.Errorf("revoke the login of role %q (generation %d): %w", name, g.Generation, err)
		}
		if st.canLogin {
			out.Revoked.Roles = append(out.Revoked.Roles, name)
		}
	}
	// NOLOGIN stops new sessions only; one opened before runs on with the
	// role's privileges. Every orphan's sessions are ended on every run,
	// not just on the run that revoked it, so a crash between the two
	// steps, or a session that slipped in during the revocation, is
	// ended the next time.
	ended, err := w.endSessions(ctx, conn.Conn(), g, orphans)
	out.SessionsEnded = ended
	if err != nil {
		return result{}, err
	}

	_, err = lock.Exec(ctx, `INSERT INTO `+generationIdent()+` AS g (machine, prefix, generation, applied_at)
VALUES ($1, $2, $3, now())
ON CONFLICT (machine, prefix) DO UPDATE SET generation = excluded.generation, applied_at = excluded.applied_at
WHERE g.generation < excluded.generation`,
		w.machine, w.prefix, int64(g.Generation))
	if err == nil {
		err = lock.Commit(ctx)
	}
	if err != nil {
		return result{}, fmt.Errorf("record generation %d of machine %s as applied: %w", g.Generation, w.machine, err)
	}
	return result{applied: out}, nil
}

// lock begins the transaction that holds this machine and mark's row in
// provision_lock until the reconcile ends. Its wait is bounded: a lock
// held longer than lockTimeout is a retryable error naming the holder.
func (w *Worker) lock(ctx context.Context, conn *pgx.Conn, g events.GrantChanged) (pgx.Tx, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin the lock of machine %s for generation %d on %s: %w", w.machine, g.Generation, w.dbTarget, err)
	}
	// The transaction idles while the work connection runs; a server-wide
	// idle_in_transaction_session_timeout would end it, and the lock,
	// half-way.
	_, err = tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d; SET LOCAL statement_timeout = %d; SET LOCAL idle_in_transaction_session_timeout = 0",
		w.lockTimeout.Milliseconds(), w.statementTimeout.Milliseconds()))
	if err == nil {
		_, err = tx.Exec(ctx, "INSERT INTO "+lockIdent()+" (machine, prefix) VALUES ($1, $2) ON CONFLICT DO NOTHING", w.machine, w.prefix)
	}
	if err == nil {
		_, err = tx.Exec(ctx, "SELECT 1 FROM "+lockIdent()+" WHERE machine = $1 AND prefix = $2 FOR UPDATE", w.machine, w.prefix)
	}
	if err == nil {
		return tx, nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = tx.Rollback(rctx)
	if !isLockTimeout(err) {
		return nil, fmt.Errorf("lock machine %s for generation %d on %s: %w", w.machine, g.Generation, w.dbTarget, err)
	}
	holders, herr := w.holders(rctx, conn, "SELECT xmax FROM "+lockIdent()+" WHERE machine = $1 AND prefix = $2", w.machine, w.prefix)
	if herr != nil {
		holders = "a session that could not be looked up (" + herr.Error() + ")"
	}
	return nil, fmt.Errorf("machine %s is being provisioned by %s, held over %s, so generation %d waits and is retried: %w", w.machine, holders, w.lockTimeout, g.Generation, err)
}

// isLockTimeout says err is PostgreSQL's lock_not_available: lock_timeout
// ran out.
func isLockTimeout(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "55P03"
}

// holder is a session that holds a row lock, as pg_stat_activity shows it.
type holder struct {
	pid         int32
	user        string
	application string
	state       string
}

// lockHolders returns the sessions whose transaction holds the row lock on
// the rows query selects (query returns their xmax). A locked row's xmax
// is the locking transaction, which pg_stat_activity shows as backend_xid.
func lockHolders(ctx context.Context, conn *pgx.Conn, query string, args ...any) ([]holder, error) {
	rows, _ := conn.Query(ctx, `SELECT a.pid, coalesce(a.usename::text, ''), coalesce(a.application_name, ''), coalesce(a.state, '')
FROM (`+query+`) r JOIN pg_catalog.pg_stat_activity a ON a.backend_xid = r.xmax
WHERE r.xmax <> '0'::xid AND a.pid <> pg_catalog.pg_backend_pid() ORDER BY a.pid`, args...)
	var (
		out []holder
		h   holder
	)
	_, err := pgx.ForEachRow(rows, []any{&h.pid, &h.user, &h.application, &h.state}, func() error {
		out = append(out, h)
		return nil
	})
	return out, err
}

// holders describes the sessions lockHolders finds, for an error message.
func (w *Worker) holders(ctx context.Context, conn *pgx.Conn, query string, args ...any) (string, error) {
	hs, err := lockHolders(ctx, conn, query, args...)
	if err != nil {
		return "", err
	}
	return describeHolders(hs), nil
}

func describeHolders(hs []holder) string {
	if len(hs) == 0 {
		return "a session that could not be identified"
	}
	parts := make([]string, len(hs))
	for i, h := range hs {
		parts[i] = fmt.Sprintf("session %d (user %q, application %q, %s)", h.pid, h.user, h.application, h.state)
	}
	return strings.Join(parts, ", ")
}

// roleExec runs a statement that changes marked role name's catalog row.
// Besides superusers, only the role itself can hold that row (ALTER ROLE
// ... PASSWORD on itself in a transaction it leaves open), so a lock
// timeout held by the role's own sessions ends those sessions and tries
// again: a consumer could otherwise hold its own revocation off for ever.
// A timeout held by anyone else is a retryable error naming them.
func (w *Worker) roleExec(ctx context.Context, conn *pgx.Conn, g events.GrantChanged, name, stmt string, out *Applied) error {
	for attempt := 1; ; attempt++ {
		_, err := conn.Exec(ctx, stmt)
		if err == nil || !isLockTimeout(err) {
			return err
		}
		hs, herr := lockHolders(ctx, conn, "SELECT xmax FROM pg_catalog.pg_authid WHERE rolname = $1", name)
		if herr != nil {
			return fmt.Errorf("role %q's catalog row was locked over %s and its holder could not be looked up (%v): %w", name, w.lockTimeout, herr, err)
		}
		own := len(hs) > 0
		for _, h := range hs {
			own = own && h.user == name
		}
		if !own || attempt == roleLockAttempts {
			return fmt.Errorf("role %q's catalog row is held by %s over %s (attempt %d), so generation %d waits and is retried: %w", name, describeHolders(hs), w.lockTimeout, attempt, g.Generation, err)
		}
		pids := make([]int32, len(hs))
		for i, h := range hs {
			pids[i] = h.pid
		}
		n, err := w.terminate(ctx, conn, g, name, pids)
		out.BlockingSessionsEnded += n
		if err != nil {
			return err
		}
	}
}

// terminate ends the sessions pids of role name and returns how many
// ended. A session still running after terminateWait is a retryable error.
func (w *Worker) terminate(ctx context.Context, conn *pgx.Conn, g events.GrantChanged, name string, pids []int32) (int, error) {
	var ended int
	err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_catalog.pg_terminate_backend(p, $2))::int FROM unnest($1::int4[]) p`,
		pids, terminateWait.Milliseconds()).Scan(&ended)
	if err != nil {
		return 0, fmt.Errorf("end the sessions %v of role %q (generation %d): %w", pids, name, g.Generation, err)
	}
	return ended, nil
}

// endSessions ends every session logged in as one of the roles named,
// and returns how many it ended. A session that outlives it is a
// retryable error: the revocation is not done until it is gone.
func (w *Worker) endSessions(ctx context.Context, conn *pgx.Conn, g events.GrantChanged, names []string) (int, error) {
	if len(names) == 0 {
		return 0, nil
	}
	const sessions = `SELECT a.pid, a.usename::text FROM pg_catalog.pg_stat_activity a
WHERE a.usesysid IN (SELECT oid FROM pg_catalog.pg_authid WHERE rolname = ANY($1::text[])) AND a.pid <> pg_catalog.pg_backend_pid()`
	var ended int
	err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_catalog.pg_terminate_backend(s.pid, $2))::int FROM (`+sessions+`) s`,
		names, terminateWait.Milliseconds()).Scan(&ended)
	if err != nil {
		return 0, fmt.Errorf("end the sessions of the revoked roles (generation %d): %w", g.Generation, err)
	}
	rows, _ := conn.Query(ctx, sessions, names)
	var (
		pid  int32
		user string
		left []string
	)
	_, err = pgx.ForEachRow(rows, []any{&pid, &user}, func() error {
		left = append(left, fmt.Sprintf("session %d of %q", pid, user))
		return nil
	})
	if err != nil {
		return ended, fmt.Errorf("check the sessions of the revoked roles ended (generation %d): %w", g.Generation, err)
	}
	if len(left) > 0 {
		return ended, fmt.Errorf("%s still running %s after pg_terminate_backend, so generation %d is not applied yet and is retried", strings.Join(left, ", "), terminateWait, g.Generation)
	}
	return ended, nil
}

// normalise revokes every membership of marked role name and returns the
// ALTER ROLE clauses that take away its powers. A marked role is the
// provisioner's, and the provisioner grants none of these: a role made by
// hand with CREATEROLE, or as a member of pg_execute_server_program or of a
// superuser, would hand its consumer the server's operating-system account
// (COPY ... TO PROGRAM) along with its password.
func (w *Worker) normalise(ctx context.Context, conn *pgx.Conn, g events.GrantChanged, name string, st roleState, out *Applied) ([]string, error) {
	if len(st.powers) == 0 && len(st.memberships) == 0 {
		return nil, nil
	}
	ident := pgx.Identifier{name}.Sanitize()
	n := Normalised{Role: name, Attributes: []string{}, Memberships: []string{}}
	for _, m := range st.memberships {
		stmt := "REVOKE " + pgx.Identifier{m.role}.Sanitize() + " FROM " + ident
		if m.grantor != "" {
			// From PostgreSQL 16 a REVOKE removes only its grantor's grant.
			stmt += " GRANTED BY " + pgx.Identifier{m.grantor}.Sanitize()
		}
		if err := w.roleExec(ctx, conn, g, name, stmt+" CASCADE", out); err != nil {
			return nil, fmt.Errorf("revoke the membership of role %q in %q (generation %d): %w", name, m.role, g.Generation, err)
		}
		if !slices.Contains(n.Memberships, m.role) {
			n.Memberships = append(n.Memberships, m.role)
		}
	}
	if len(st.memberships) > 0 {
		var left []string
		err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(DISTINCT p.rolname::text), '{}') FROM pg_catalog.pg_auth_members m
JOIN pg_catalog.pg_authid p ON p.oid = m.roleid JOIN pg_catalog.pg_authid r ON r.oid = m.member WHERE r.rolname = $1`, name).Scan(&left)
		if err != nil {
			return nil, fmt.Errorf("check the memberships of role %q were revoked (generation %d): %w", name, g.Generation, err)
		}
		if len(left) > 0 {
			return nil, fmt.Errorf("role %q is still a member of %q after REVOKE, so it gets no password and generation %d is retried", name, left, g.Generation)
		}
	}
	clauses := make([]string, len(st.powers))
	for i, p := range st.powers {
		clauses[i] = "NO" + p
		n.Attributes = append(n.Attributes, p)
	}
	out.Normalised = append(out.Normalised, n)
	return clauses, nil
}

// applyRole creates the consumer's role or brings its powers, login and
// password to the grant. passwordCurrent says the stored verifier already
// matches the granted password, so an unchanged password costs no write.
// An existing role is normalised before, or in the same statement as, it
// gets its password, so a consumer never logs in with powers the
// provisioner did not give.
func (w *Worker) applyRole(ctx context.Context, conn *pgx.Conn, g events.GrantChanged, c consumer, st roleState, passwordCurrent bool, out *Applied) error {
	ident := pgx.Identifier{c.role}.Sanitize()
	exists := st.exists
	var clauses []string
	normalised := false
	if exists {
		var err error
		if clauses, err = w.normalise(ctx, conn, g, c.role, st, out); err != nil {
			return err
		}
		normalised = len(st.powers) > 0 || len(st.memberships) > 0
	}
	if !exists || !st.canLogin {
		clauses = append(clauses, "LOGIN")
	}
	if !exists || !passwordCurrent {
		v, err := newVerifier(c.password)
		if err != nil {
			return err
		}
		lit, err := verifierLiteral(v)
		if err != nil {
			return err
		}
		clauses = append(clauses, "PASSWORD "+lit)
	}
	switch {
	case !exists:
		stmt := "CREATE ROLE " + ident + " WITH NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS " + strings.Join(clauses, " ")
		if _, err := conn.Exec(ctx, stmt); err != nil {
			// The statement holds a verifier, never shown: only the role.
			return fmt.Errorf("create role %q (generation %d): %w", c.role, g.Generation, err)
		}
		out.Created.Roles = append(out.Created.Roles, c.role)
	case len(clauses) > 0 || normalised:
		if len(clauses) > 0 {
			if err := w.roleExec(ctx, conn, g, c.role, "ALTER ROLE "+ident+" WITH "+strings.Join(clauses, " "), out); err != nil {
				return fmt.Errorf("alter role %q (generation %d): %w", c.role, g.Generation, err)
			}
		}
		out.Altered.Roles = append(out.Altered.Roles, c.role)
	default:
		out.Unchanged.Roles = append(out.Unchanged.Roles, c.role)
	}
	return nil
}

// dbState is a granted database as the server has it.
type dbState struct {
	owner string
	// defaultACL says its privileges were never granted or revoked, so
	// PUBLIC may still connect: the state CREATE DATABASE leaves.
	defaultACL bool
}

// readState reads, in three queries, the connected user, every role with
// the mark (with its powers and memberships) and the granted databases
// that exist.
func (w *Worker) readState(ctx context.Context, conn *pgx.Conn, consumers []consumer) (current string, roles map[string]roleState, dbs map[string]dbState, err error) {
	if err := conn.QueryRow(ctx, "SELECT current_user").Scan(&current); err != nil {
		return "", nil, nil, fmt.Errorf("read the current user of %s: %w", w.dbTarget, err)
	}
	// Both arrays in one order, so they pair up.
	rows, _ := conn.Query(ctx, `SELECT r.rolname::text, r.rolcanlogin, coalesce(r.rolpassword, ''),
	array_remove(ARRAY[CASE WHEN r.rolsuper THEN 'SUPERUSER' END, CASE WHEN r.rolcreatedb THEN 'CREATEDB' END,
		CASE WHEN r.rolcreaterole THEN 'CREATEROLE' END, CASE WHEN r.rolreplication THEN 'REPLICATION' END,
		CASE WHEN r.rolbypassrls THEN 'BYPASSRLS' END], NULL),
	ARRAY(SELECT p.rolname::text FROM pg_catalog.pg_auth_members m JOIN pg_catalog.pg_authid p ON p.oid = m.roleid
		LEFT JOIN pg_catalog.pg_authid gr ON gr.oid = m.grantor WHERE m.member = r.oid ORDER BY p.rolname, coalesce(gr.rolname::text, '')),
	ARRAY(SELECT coalesce(gr.rolname::text, '') FROM pg_catalog.pg_auth_members m JOIN pg_catalog.pg_authid p ON p.oid = m.roleid
		LEFT JOIN pg_catalog.pg_authid gr ON gr.oid = m.grantor WHERE m.member = r.oid ORDER BY p.rolname, coalesce(gr.rolname::text, ''))
FROM pg_catalog.pg_authid r WHERE starts_with(r.rolname::text, $1)`, w.prefix)
	roles = map[string]roleState{}
	var (
		name            string
		st              roleState
		member, grantor []string
	)
	_, err = pgx.ForEachRow(rows, []any{&name, &st.canLogin, &st.password, &st.powers, &member, &grantor}, func() error {
		if len(member) != len(grantor) {
			return fmt.Errorf("role %q: %d memberships but %d grantors", name, len(member), len(grantor))
		}
		r := st
		r.exists = true
		r.powers = slices.Clone(st.powers)
		r.memberships = make([]membership, len(member))
		for i := range member {
			r.memberships[i] = membership{role: member[i], grantor: grantor[i]}
		}
		roles[name] = r
		return nil
	})
	if err != nil {
		return "", nil, nil, fmt.Errorf("read the roles marked %s from pg_authid on %s (the user must be a superuser): %w", w.prefix, w.dbTarget, err)
	}
	wanted := make([]string, len(consumers))
	for i, c := range consumers {
		wanted[i] = c.database
	}
	rows, _ = conn.Query(ctx, `SELECT datname::text, pg_catalog.pg_get_userbyid(datdba)::text, datacl IS NULL
FROM pg_catalog.pg_database WHERE datname::text = ANY($1::text[])`, wanted)
	dbs = map[string]dbState{}
	var db dbState
	_, err = pgx.ForEachRow(rows, []any{&name, &db.owner, &db.defaultACL}, func() error {
		dbs[name] = db
		return nil
	})
	if err != nil {
		return "", nil, nil, fmt.Errorf("read the granted databases on %s: %w", w.dbTarget, err)
	}
	return current, roles, dbs, nil
}

// checkState refuses a grant the server's present state makes unsafe.
// It runs before anything is changed. A marked role with powers is not
// refused: it is the provisioner's, so it is normalised.
func (w *Worker) checkState(g events.GrantChanged, consumers []consumer, current string, dbs map[string]dbState) *refusal {
	for _, c := range consumers {
		ref := func(rule, format string, args ...any) *refusal {
			return &refusal{Refused{Machine: w.machine, Generation: g.Generation, Consumer: c.node, Rule: rule,
				Reason: fmt.Sprintf("consumer %q: ", c.node) + fmt.Sprintf(format, args...)}}
		}
		if c.role == current {
			return ref("role-is-steward", "role %q is the user Steward connects as; a grant never sets its password, so grant another node or connect as another user", c.role)
		}
		if db, ok := dbs[c.database]; ok && db.owner != c.role {
			return ref("database-owner", "database %q exists and is owned by %q, not %q; Steward never takes a database over: change its owner to %q or grant another name", c.database, db.owner, c.role, c.role)
		}
	}
	return nil
}

func generationIdent() string {
	return pgx.Identifier{generationSchema, generationTable}.Sanitize()
}

func lockIdent() string {
	return pgx.Identifier{generationSchema, lockTable}.Sanitize()
}

// ensureTable creates Steward's schema, generation table and lock table
// when they are missing, and checks that only a superuser owns them: their
// owner could hold the lock, so a consumer owning them could stall every
// reconcile. Two first runs racing on the catalog make one fail with a
// duplicate; it looks again. (No advisory lock: every role may take one.)
func (w *Worker) ensureTable(ctx context.Context, conn *pgx.Conn) error {
	if w.tableReady.Load() {
		return nil
	}
	create := func(tx pgx.Tx) error {
		var missing bool
		if err := tx.QueryRow(ctx, "SELECT pg_catalog.to_regclass($1) IS NULL OR pg_catalog.to_regclass($2) IS NULL", generationIdent(), lockIdent()).Scan(&missing); err != nil || !missing {
			return err
		}
		// A schema created here has no privileges for PUBLIC: consumers
		// can neither read nor lock its tables.
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{generationSchema}.Sanitize()); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+generationIdent()+` (
	machine    text        NOT NULL,
	prefix     text        NOT NULL,
	generation bigint      NOT NULL CHECK (generation > 0),
	applied_at timestamptz NOT NULL,
	PRIMARY KEY (machine, prefix)
)`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+lockIdent()+` (
	machine text NOT NULL,
	prefix  text NOT NULL,
	PRIMARY KEY (machine, prefix)
)`)
		return err
	}
	var err error
	for range 3 {
		if err = pgx.BeginFunc(ctx, conn, create); !isDuplicate(err) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("ensure tables %s and %s on %s: %w", generationIdent(), lockIdent(), w.dbTarget, err)
	}
	rows, _ := conn.Query(ctx, `SELECT n.nspname::text, o.rolname::text FROM pg_catalog.pg_namespace n JOIN pg_catalog.pg_roles o ON o.oid = n.nspowner
WHERE n.nspname = $1 AND NOT o.rolsuper
UNION ALL
SELECT n.nspname::text || '.' || c.relname::text, o.rolname::text FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
JOIN pg_catalog.pg_roles o ON o.oid = c.relowner WHERE n.nspname = $1 AND c.relname::text = ANY($2::text[]) AND NOT o.rolsuper`,
		generationSchema, []string{generationTable, lockTable})
	var (
		object, owner string
		bad           []string
	)
	_, err = pgx.ForEachRow(rows, []any{&object, &owner}, func() error {
		bad = append(bad, fmt.Sprintf("%q is owned by %q", object, owner))
		return nil
	})
	if err != nil {
		return fmt.Errorf("check the owners of schema %q on %s: %w", generationSchema, w.dbTarget, err)
	}
	if len(bad) > 0 {
		return fmt.Errorf("%s, not a superuser, and its owner could hold Steward's lock for ever: change the owner to a superuser (ALTER ... OWNER TO); every grant is retried until then", strings.Join(bad, "; "))
	}
	w.tableReady.Store(true)
	return nil
}

// isDuplicate says err is a catalog race lost to a concurrent creation.
func isDuplicate(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "23505" || pe.Code == "42P06" || pe.Code == "42P07")
}

// passwordsCurrent checks, for each consumer whose role exists, whether
// the stored verifier matches the granted password. Each check is a
// PBKDF2 of thousands of rounds, so they run on every CPU.
func passwordsCurrent(consumers []consumer, roles map[string]roleState) []bool {
	out := make([]bool, len(consumers))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(consumers)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				st := roles[consumers[i].role]
				out[i] = st.exists && verifierMatches(st.password, consumers[i].password)
			}
		}()
	}
	for i := range consumers {
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}
