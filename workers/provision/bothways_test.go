package provision

import (
	"context"
	"math"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/bothways"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers/workertest"
)

// TestStoriesBothWays runs each story of machine db-1 in memory and on the
// real runtime on an embedded server, against the real PostgreSQL (issue
// 24): both must come to the story's verdicts, outcomes, dead letters and
// server state (the applied generation, the marked roles with their login
// and password, the databases and their owners), and to the same ones,
// outcome data included. The two runs use one prefix, so their outcomes
// name the same roles; the server is emptied of it before each run. The
// worker keeps no state documents: its state is the server's.
func TestStoriesBothWays(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	attacker := filepath.Join(dir, "attacker.key")
	if err := signing.GenerateKeyPair(signing.Ed25519, attacker, filepath.Join(dir, "attacker.pub")); err != nil {
		t.Fatal(err)
	}
	// The passwords of the stories, by the name the effects show.
	passwords := map[string]string{"first": "p-first", "second": "p-second", "third": "p-third", "attacker": "p-attacker"}

	step := func(what string, g events.GrantChanged) bothways.Step {
		return bothways.Step{What: what, Event: grantEvent(t, g)}
	}
	// grant is generation gen of db-1 giving node a its database a with
	// the named password, signed by the controller.
	grant := func(gen uint64, password string) bothways.Step {
		return step("grant.changed generation "+strconv.FormatUint(gen, 10)+" for db-1 (signed)", e.grant(gen, giv{"a", e.db("a"), passwords[password]}))
	}
	raw := func(what, typ, key string, fields map[string]any) bothways.Step {
		return bothways.Step{What: what, Event: bothways.Raw(t, typ, key, fields)}
	}
	good := e.grant(4, giv{"a", e.db("a"), passwords["attacker"]})
	fields := func(extra ...any) map[string]any {
		f := map[string]any{"machine": testMachine, "requirement": good.Requirement, "generation": good.Generation, "given": good.Given, "envelope": good.Envelope}
		for i := 0; i+1 < len(extra); i += 2 {
			f[extra[i].(string)] = extra[i+1]
		}
		return f
	}
	v := func(list ...workertest.Verdict) []workertest.Verdict { return list }
	// server is the server state of a machine at generation gen whose
	// consumer a logs in with the named password into its database a.
	server := func(gen int, password string) map[string]any {
		return map[string]any{
			"generation": map[string]any{"applied": gen},
			"roles":      map[string]any{"a": "login with the " + password + " password"},
			"databases":  map[string]any{"a": "owned by a"},
		}
	}
	untouched := map[string]any{"generation": map[string]any{"applied": 0}, "roles": map[string]any{}, "databases": map[string]any{}}
	none := map[string]any{}
	g1 := grant(1, "first")

	stories := []bothways.Story{
		{
			Name:  "happy path",
			Steps: []bothways.Step{g1},
			Want:  bothways.Want{Verdicts: v(workertest.Applied), Outcomes: []string{"db-1 applied"}, State: none, Effects: server(1, "first")},
		},
		{
			Name:  "the same grant republished, queued together: the copy supersedes the first",
			Steps: []bothways.Step{grant(1, "first"), grant(1, "first")},
			Want: bothways.Want{
				Verdicts: v(workertest.Superseded, workertest.Applied),
				Outcomes: []string{"db-1 superseded", "db-1 applied"}, State: none, Effects: server(1, "first"),
			},
		},
		{
			Name:  "the same event twice (one id): stored once",
			Steps: []bothways.Step{g1, g1},
			Want: bothways.Want{
				Verdicts: v(workertest.Applied, workertest.Applied),
				Outcomes: []string{"db-1 applied"}, State: none, Effects: server(1, "first"),
			},
			Right: bothways.OnRuntime,
		},
		{
			Name:  "latest wins: of generations 1, 3 and 2 queued together 1 is superseded, 3 applied, 2 skipped as older",
			Steps: []bothways.Step{grant(1, "first"), grant(3, "third"), grant(2, "second")},
			Want: bothways.Want{
				Verdicts: v(workertest.Superseded, workertest.Applied, workertest.Applied),
				Outcomes: []string{"db-1 superseded", "db-1 applied", "db-1 skipped"}, State: none, Effects: server(3, "third"),
			},
		},
		{
			Name: "policy refusals: an unsigned huge generation, one signed by the attacker's key; neither supersedes the real one",
			Steps: []bothways.Step{
				grant(1, "first"),
				step("grant.changed generation 2^63-1 for db-1 (unsigned)", unsigned(e.grant(math.MaxInt64, giv{"a", e.db("a"), passwords["attacker"]}))),
				step("grant.changed generation 2^63-1 for db-1 (signed by another key)", signGrantWith(t, attacker, unsigned(e.grant(math.MaxInt64, giv{"a", e.db("a"), passwords["attacker"]})))),
			},
			Want: bothways.Want{
				Verdicts: v(workertest.Applied, workertest.Refused, workertest.Refused),
				Outcomes: []string{"db-1 applied", "db-1 refused", "db-1 refused"}, State: none, Effects: server(1, "first"),
			},
		},
		{
			Name: "bad inputs go to the DLQ without reaching the handler",
			Steps: []bothways.Step{
				raw("a field the schema does not have", events.TypeGrantChanged, testMachine, fields("superuser", true)),
				raw("a requirement the schema does not have", events.TypeGrantChanged, testMachine, fields("requirement", "mysql")),
				raw("a machine with dots", events.TypeGrantChanged, "db.1", fields("machine", "db.1")),
				raw("a machine with '>'", events.TypeGrantChanged, "db-1>", fields("machine", "db-1>")),
				raw("a type no worker handles", "dev.example.grant.revoked.v1", testMachine, fields()),
				raw("subject db-1, data naming db-2", events.TypeGrantChanged, testMachine, fields("machine", "db-2")),
			},
			Want: bothways.Want{
				Verdicts: v(workertest.DeadLettered, workertest.DeadLettered, workertest.DeadLettered, workertest.DeadLettered, workertest.DeadLettered, workertest.DeadLettered),
				DeadLetters: []string{`"superuser"`, "/requirement", "/machine: does not match pattern", "/machine: does not match pattern",
					"is not a Steward event type", `must equal the data's machine "db-2"`},
				State: none, Effects: untouched,
			},
		},
	}
	for _, s := range stories {
		t.Run(s.Name, func(t *testing.T) {
			machineRunner(e, passwords, false).Run(t, s)
		})
	}

	// Another machine's grant, published as that machine's, is kept away by
	// the consumer's filter on the runtime; in memory workertest's Runner
	// hands it to the handler all the same (it does not apply
	// Spec.Subjects), and Replay on the runtime waits for it until its
	// timeout fails the test, so no story can tell it both ways today. A
	// consumer misconfigured to see every machine shows the handler's own
	// guard, both ways.
	other := e.grant(2, giv{"a", e.db("a"), passwords["attacker"]})
	other.Machine = "db-2"
	other = signGrant(t, other)
	t.Run("another machine's grant reaching a consumer that sees every machine is refused", func(t *testing.T) {
		machineRunner(e, passwords, true).Run(t, bothways.Story{
			Name:  "another machine's grant reaching a consumer that sees every machine is refused",
			Steps: []bothways.Step{grant(1, "first"), step("grant.changed generation 2 for db-2 (signed)", other)},
			Want: bothways.Want{
				Verdicts: v(workertest.Applied, workertest.Refused),
				Outcomes: []string{"db-1 applied", "db-2 refused"}, State: none, Effects: server(1, "first"),
			},
		})
	})
}

// machineRunner makes a fresh provision worker of db-1 for each run, on
// e's prefix emptied first; a wide one consumes every machine's grants, as
// a misconfigured consumer would. Its effects are the server's state under
// the prefix, each role's password named by the one of passwords it
// matches.
func machineRunner(e *env, passwords map[string]string, wide bool) bothways.Runner {
	return bothways.Runner{New: func(t *testing.T, _ bothways.Mode) bothways.Worker {
		// What the env fails and cleans up from now on belongs to this
		// run's test: the worker's pool closes when the run ends.
		e.tb = t
		e.empty()
		w := e.worker(nil)
		spec := w.Spec()
		if wide {
			spec.Instance = "wide"
			spec.Subjects = []string{"steward.events.grant.changed.*"}
		}
		return bothways.Worker{Spec: spec, Handler: w, Effects: func(t *testing.T) map[string]any {
			return e.serverState(passwords)
		}}
	}}
}

// empty drops everything under the env's prefix and reconnects, so the
// next run starts on an untouched server.
func (e *env) empty() {
	e.tb.Helper()
	if err := e.drop(); err != nil {
		e.tb.Fatal(err)
	}
	admin, err := pgx.Connect(context.Background(), e.url)
	if err != nil {
		e.tb.Fatalf("reconnect to the test PostgreSQL %s: %v", e.url, err)
	}
	e.admin = admin
}

// serverState is what the server holds under the env's prefix, with the
// prefix left out: the applied generation, each marked role's login and
// which of passwords it holds (by name: no password is printed), and the
// owner of each database.
func (e *env) serverState(passwords map[string]string) map[string]any {
	e.tb.Helper()
	roles := map[string]any{}
	for name, r := range e.markedRoles() {
		login := "nologin"
		if r.canLogin {
			login = "login"
		}
		which := "no known"
		var names []string
		for n := range passwords {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			if verifierMatches(r.verifier, passwords[n]) {
				which = "the " + n
			}
		}
		roles[strings.TrimPrefix(name, e.prefix)] = login + " with " + which + " password"
	}
	rows, _ := e.admin.Query(context.Background(), `SELECT datname::text, pg_get_userbyid(datdba)::text FROM pg_database WHERE starts_with(datname::text, $1)`, e.prefix)
	dbs := map[string]any{}
	var db, owner string
	if _, err := pgx.ForEachRow(rows, []any{&db, &owner}, func() error {
		dbs[strings.TrimPrefix(db, e.prefix)] = "owned by " + strings.TrimPrefix(owner, e.prefix)
		return nil
	}); err != nil {
		e.tb.Fatal(err)
	}
	return map[string]any{
		"generation": map[string]any{"applied": e.appliedGeneration()},
		"roles":      roles,
		"databases":  dbs,
	}
}
