package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/signing"
)

// grant is generation gen of machine's whole desired state: one consumer
// per node, each with a database named like the node and its own password,
// signed with the controller key at signingKey (as steward publish
// --signing-key signs it); "" leaves it unsigned, for an ingress that signs.
func grant(t testing.TB, signingKey, recipient, machine string, gen uint64, nodes ...string) event.Event {
	t.Helper()
	g := events.GrantChanged{Machine: machine, Requirement: "postgres", Generation: gen, Given: []events.Given{}}
	for _, n := range nodes {
		secret := encryptTo(t, recipient, fmt.Sprintf("pw-%s-%d", n, gen))
		g.Given = append(g.Given, events.Given{From: "e2e", Node: n, Values: events.GivenValues{Name: n}, Secret: secret})
	}
	if signingKey != "" {
		key, err := signing.LoadPrivateKey(signingKey)
		if err != nil {
			t.Fatal(err)
		}
		if g, err = signing.SignGrant(key, g); err != nil {
			t.Fatal(err)
		}
	}
	e, err := events.New(events.TypeGrantChanged, machine, g)
	if err != nil {
		t.Fatal(err)
	}
	e.SetID(fmt.Sprintf("grant-%s-%d", machine, gen))
	e.SetSource("/steward/e2e")
	return e
}

// provisionFault is a provision worker on its own NATS and private
// PostgreSQL, with generation 1 of machine's grant applied.
type provisionFault struct {
	pg         *postgres
	b          *bus
	w          *stewardService
	signingKey string
	recipient  string
}

// startProvisionFault starts the worker with env added to its settings,
// publishes generation 1 (one consumer, "orders") and waits until it is
// applied.
func startProvisionFault(t *testing.T, machine string, env map[string]string) *provisionFault {
	t.Helper()
	f := &provisionFault{pg: startPostgres(t)}
	n := startNATS(t, "n1")
	f.b = connect(t, n.url())
	f.b.ensureStreams(t, 1)
	keys := t.TempDir()
	f.recipient = recipientOf(t, makeKey(t, keys, "age", "machine"))
	controllerPub := makeKey(t, keys, "controller", "controller")
	f.signingKey = keys + "/controller.key"
	settings := map[string]string{
		"STEWARD_NATS_URL":       n.url(),
		"STEWARD_MACHINE":        machine,
		"STEWARD_CONTROLLER_KEY": controllerPub,
		"STEWARD_AGE_IDENTITY":   keys + "/machine.key",
		"STEWARD_DATABASE_URL":   f.pg.url("postgres"),
	}
	maps.Copy(settings, env)
	f.w = startWorker(t, "provision", settings)

	g1 := grant(t, f.signingKey, f.recipient, machine, 1, "orders")
	f.b.publish(t, g1)
	if o := waitOutcome(t, f.b, "provision", machine, g1.ID(), time.Minute); o.Type() != "dev.steward.grant.applied.v1" {
		t.Fatalf("generation 1: outcome %s (%s); want applied", o.Type(), o.Data())
	}
	return f
}

// TestFaultPostgresRestart is fault 4. Invariant: a grant published while
// PostgreSQL is down is retried (and the retries show in the worker's
// metrics, steward_events_total{result="retried"}), and completes once
// PostgreSQL is back: the roles, their passwords and the databases are
// there, and the applied generation is recorded. The grant is never dead-
// lettered and never applied twice.
//
// PostgreSQL here is a private instance: the machine's shared server is
// used by other packages' tests at the same time and is never stopped.
func TestFaultPostgresRestart(t *testing.T) {
	const machine = "m1"
	f := startProvisionFault(t, machine, nil)
	pg, b, w, signingKey, recipient := f.pg, f.b, f.w, f.signingKey, f.recipient

	pg.stop(t)
	stopped := time.Now()
	g2 := grant(t, signingKey, recipient, machine, 2, "orders", "billing")
	b.publish(t, g2)
	retriedWhileDown := 0.0
	waitFor(t, "the worker retries the grant while PostgreSQL is down", time.Minute, func() (bool, string) {
		v, err := w.metric("steward_events_total", `worker="provision"`, `result="retried"`)
		if err != nil {
			return false, err.Error()
		}
		retriedWhileDown = v
		return v >= 3, fmt.Sprintf("%v retried", v)
	})
	outage := time.Since(stopped)
	if outs := outcomesByCause(t, b, "provision", machine)[g2.ID()]; len(outs) != 0 {
		t.Fatalf("generation 2 has outcome %s while PostgreSQL is down", outs[0].Type())
	}
	pg.start(t)
	restarted := time.Now()
	o := waitOutcome(t, b, "provision", machine, g2.ID(), 2*time.Minute)
	recover := time.Since(restarted)
	if o.Type() != "dev.steward.grant.applied.v1" {
		t.Fatalf("generation 2: outcome %s (%s); want applied", o.Type(), o.Data())
	}
	var applied struct {
		Generation uint64 `json:"generation"`
		Created    struct {
			Roles     []string `json:"roles"`
			Databases []string `json:"databases"`
		} `json:"created"`
	}
	if err := json.Unmarshal(o.Data(), &applied); err != nil {
		t.Fatal(err)
	}
	if applied.Generation != 2 || !slices.Contains(applied.Created.Roles, "mesh_billing") {
		t.Errorf("generation 2 applied %s; want mesh_billing created", o.Data())
	}
	waitFor(t, "provision-"+machine+" has settled every event", time.Minute, func() (bool, string) {
		return b.consumerIdle("provision-" + machine)
	})

	retried, err := w.metric("steward_events_total", `worker="provision"`, `result="retried"`)
	if err != nil {
		t.Fatal(err)
	}
	appliedCount, err := w.metric("steward_events_total", `worker="provision"`, `result="applied"`)
	if err != nil {
		t.Fatal(err)
	}
	if appliedCount != 2 {
		t.Errorf("steward_events_total{result=applied} = %v; want 2 (one per generation)", appliedCount)
	}
	roles := pg.query(t, `SELECT rolname || ':' || rolcanlogin || ':' || (rolpassword LIKE 'SCRAM-SHA-256$%') FROM pg_authid WHERE rolname LIKE 'mesh\_%' ORDER BY 1`)
	if want := []string{"mesh_billing:true:true", "mesh_orders:true:true"}; !slices.Equal(roles, want) {
		t.Errorf("roles %v; want %v (login, SCRAM password)", roles, want)
	}
	dbs := pg.query(t, `SELECT datname || ':' || pg_get_userbyid(datdba) FROM pg_database WHERE datname IN ('orders', 'billing') ORDER BY 1`)
	if want := []string{"billing:mesh_billing", "orders:mesh_orders"}; !slices.Equal(dbs, want) {
		t.Errorf("databases %v; want %v", dbs, want)
	}
	gens := pg.query(t, `SELECT generation FROM steward.provision_generation WHERE machine = $1`, machine)
	if !slices.Equal(gens, []string{"2"}) {
		t.Errorf("recorded generation %v; want [2]", gens)
	}
	dead := b.deadLetters(t, "provision", machine)
	outs := outcomesByCause(t, b, "provision", machine)
	if len(dead) != 0 || len(outs[g2.ID()]) != 1 {
		t.Errorf("%d dead letters and %d outcomes for generation 2; want 0 and 1", len(dead), len(outs[g2.ID()]))
	}

	summary(t, "fault4-postgres-restart",
		"events", 2, "postgres_restarts", 1, "retried_while_down", retriedWhileDown, "retried_total", retried,
		"applied", appliedCount, "dead_lettered", len(dead), "lost", 0, "duplicates_applied", len(outs[g2.ID()])-1,
		"outage", round(outage), "recover", round(recover))
	t.Logf("roles %s; databases %s", strings.Join(roles, " "), strings.Join(dbs, " "))
}
