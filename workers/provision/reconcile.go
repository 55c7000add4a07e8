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

	"github.com/steward-dev/steward/events"
)

// The applied generation lives in the database server itself, in a table
// in Steward's own schema, keyed by machine and mark prefix. The server is
// the state being reconciled, so the generation that describes it belongs
// beside it: every worker process that provisions this server, whatever
// NATS it hears from and whatever its KV bucket holds, reads the same row
// under the same advisory lock, so an older generation is never applied
// over a newer one even across workers. It is written only after a
// reconcile completes, so a grant that half-applied before a crash is not
// "applied" and its redelivery runs it again to the end.
const (
	generationSchema = "steward"
	generationTable  = "provision_generation"
)

// result is what a reconcile did: exactly one of the two is set.
type result struct {
	applied *Applied
	skipped *Skipped
}

// roleState is a marked role as the server has it.
type roleState struct {
	exists     bool
	canLogin   bool
	privileged bool
	password   string // rolpassword: a verifier, an md5 hash or ""
}

// reconcile makes the server match grant g. It returns a *refusal when g
// is refused (nothing changed), any other error when a retry may succeed.
func (w *Worker) reconcile(ctx context.Context, g events.GrantChanged) (result, error) {
	if r := w.checkGrant(g); r != nil {
		return result{}, r
	}
	conn, err := w.pool.Acquire(ctx)
	if err != nil {
		return result{}, fmt.Errorf("%s is unreachable, so generation %d waits for it: %w", w.dbTarget, g.Generation, err)
	}
	locked := false
	defer func() {
		if locked {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_, uerr := conn.Exec(uctx, "SELECT pg_catalog.pg_advisory_unlock(pg_catalog.hashtextextended($1, 0))", w.lockName())
			cancel()
			if uerr != nil {
				// Closing the session is what releases its lock for sure.
				_ = conn.Conn().Close(context.Background())
			}
		}
		conn.Release()
	}()
	// Every reconcile of this machine and mark on this server takes the
	// same session lock, so two workers never interleave theirs.
	if _, err := conn.Exec(ctx, "SELECT pg_catalog.pg_advisory_lock(pg_catalog.hashtextextended($1, 0))", w.lockName()); err != nil {
		return result{}, fmt.Errorf("lock %s for machine %s: %w", w.dbTarget, w.machine, err)
	}
	locked = true
	if err := w.ensureTable(ctx, conn.Conn()); err != nil {
		return result{}, err
	}

	var applied int64
	err = conn.QueryRow(ctx, "SELECT generation FROM "+generationIdent()+" WHERE machine = $1 AND prefix = $2", w.machine, w.prefix).Scan(&applied)
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
	if ref := w.checkState(g, consumers, me, roles, dbs); ref != nil {
		return result{}, ref
	}

	current := passwordsCurrent(consumers, roles)
	out := &Applied{Machine: w.machine, Generation: g.Generation,
		Created: newNames(), Altered: newNames(), Revoked: newNames(), Unchanged: newNames()}
	granted := make(map[string]bool, len(consumers))
	for i, c := range consumers {
		granted[c.role] = true
		if err := w.applyRole(ctx, conn.Conn(), c, roles[c.role], current[i], out); err != nil {
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
			stmt := "CREATE DATABASE " + pgx.Identifier{c.database}.Sanitize() + " OWNER " + pgx.Identifier{c.role}.Sanitize()
			if _, err := conn.Exec(ctx, stmt); err != nil {
				return result{}, fmt.Errorf("create database %q for role %s (generation %d): %w", c.database, c.role, g.Generation, err)
			}
			out.Created.Databases = append(out.Created.Databases, c.database)
		}
		// A new database lets PUBLIC, so every role on the server, connect
		// and make temporary tables; a consumer's database is its owner's
		// alone.
		if _, err := conn.Exec(ctx, "REVOKE ALL ON DATABASE "+pgx.Identifier{c.database}.Sanitize()+" FROM PUBLIC"); err != nil {
			return result{}, fmt.Errorf("revoke PUBLIC's privileges on database %q of role %s (generation %d): %w", c.database, c.role, g.Generation, err)
		}
	}

	// Orphans lose their login but keep what they own: whether their
	// databases go is somebody's decision, not a reconcile's.
	names := make([]string, 0, len(roles))
	for name := range roles {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if granted[name] || !roles[name].canLogin || name == me {
			continue
		}
		if _, err := conn.Exec(ctx, "ALTER ROLE "+pgx.Identifier{name}.Sanitize()+" WITH NOLOGIN"); err != nil {
			return result{}, fmt.Errorf("revoke the login of role %s (generation %d): %w", name, g.Generation, err)
		}
		out.Revoked.Roles = append(out.Revoked.Roles, name)
	}

	_, err = conn.Exec(ctx, `INSERT INTO `+generationIdent()+` AS g (machine, prefix, generation, applied_at)
VALUES ($1, $2, $3, now())
ON CONFLICT (machine, prefix) DO UPDATE SET generation = excluded.generation, applied_at = excluded.applied_at
WHERE g.generation < excluded.generation`,
		w.machine, w.prefix, int64(g.Generation))
	if err != nil {
		return result{}, fmt.Errorf("record generation %d of machine %s as applied: %w", g.Generation, w.machine, err)
	}
	return result{applied: out}, nil
}

// applyRole creates the consumer's role or brings its login and password
// to the grant. passwordCurrent says the stored verifier already matches
// the granted password, so an unchanged password costs no write.
func (w *Worker) applyRole(ctx context.Context, conn *pgx.Conn, c consumer, st roleState, passwordCurrent bool, out *Applied) error {
	ident := pgx.Identifier{c.role}.Sanitize()
	exists := st.exists
	var clauses []string
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
			return fmt.Errorf("create role %s: %w", c.role, err)
		}
		out.Created.Roles = append(out.Created.Roles, c.role)
	case len(clauses) > 0:
		if _, err := conn.Exec(ctx, "ALTER ROLE "+ident+" WITH "+strings.Join(clauses, " ")); err != nil {
			return fmt.Errorf("alter role %s: %w", c.role, err)
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

// readState reads, in two queries, the connected user, every role with
// the mark and the granted databases that exist.
func (w *Worker) readState(ctx context.Context, conn *pgx.Conn, consumers []consumer) (current string, roles map[string]roleState, dbs map[string]dbState, err error) {
	if err := conn.QueryRow(ctx, "SELECT current_user").Scan(&current); err != nil {
		return "", nil, nil, fmt.Errorf("read the current user of %s: %w", w.dbTarget, err)
	}
	rows, _ := conn.Query(ctx, `SELECT rolname::text, rolcanlogin, rolsuper OR rolreplication OR rolbypassrls, coalesce(rolpassword, '')
FROM pg_catalog.pg_authid WHERE starts_with(rolname::text, $1)`, w.prefix)
	roles = map[string]roleState{}
	var (
		name string
		st   = roleState{exists: true}
	)
	_, err = pgx.ForEachRow(rows, []any{&name, &st.canLogin, &st.privileged, &st.password}, func() error {
		roles[name] = st
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
// It runs before anything is changed.
func (w *Worker) checkState(g events.GrantChanged, consumers []consumer, current string, roles map[string]roleState, dbs map[string]dbState) *refusal {
	for _, c := range consumers {
		ref := func(rule, format string, args ...any) *refusal {
			return &refusal{Refused{Machine: w.machine, Generation: g.Generation, Consumer: c.node, Rule: rule,
				Reason: fmt.Sprintf("consumer %q: ", c.node) + fmt.Sprintf(format, args...)}}
		}
		if c.role == current {
			return ref("role-is-steward", "role %s is the user Steward connects as; a grant never sets its password", c.role)
		}
		if roles[c.role].privileged {
			return ref("role-privileged", "role %s exists with SUPERUSER, REPLICATION or BYPASSRLS; a granted password would hand that power to a consumer, so remove the attribute or rename the role by hand", c.role)
		}
		if db, ok := dbs[c.database]; ok && db.owner != c.role {
			return ref("database-owner", "database %q exists and is owned by %q, not %s; Steward never takes a database over: change its owner to %s or grant another name", c.database, db.owner, c.role, c.role)
		}
	}
	return nil
}

func generationIdent() string {
	return pgx.Identifier{generationSchema, generationTable}.Sanitize()
}

func (w *Worker) lockName() string {
	return "steward.provision/" + w.machine + "/" + w.prefix
}

// ensureTable creates Steward's schema and generation table when they are
// missing. Creation is serialised by a transaction-scoped advisory lock, so
// concurrent first runs do not race on the catalog.
func (w *Worker) ensureTable(ctx context.Context, conn *pgx.Conn) error {
	if w.tableReady.Load() {
		return nil
	}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var exists bool
		if err := tx.QueryRow(ctx, "SELECT pg_catalog.to_regclass($1) IS NOT NULL", generationIdent()).Scan(&exists); err != nil {
			return err
		}
		if exists {
			return nil
		}
		if _, err := tx.Exec(ctx, "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('steward.schema', 0))"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{generationSchema}.Sanitize()); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+generationIdent()+` (
	machine    text        NOT NULL,
	prefix     text        NOT NULL,
	generation bigint      NOT NULL CHECK (generation > 0),
	applied_at timestamptz NOT NULL,
	PRIMARY KEY (machine, prefix)
)`)
		return err
	})
	if err != nil {
		return fmt.Errorf("ensure table %s on %s: %w", generationIdent(), w.dbTarget, err)
	}
	w.tableReady.Store(true)
	return nil
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
