package e2e

import (
	"fmt"
	"os"
	"slices"
	"testing"
	"time"
)

// TestFaultPostgresDownForMinutes is the convergence fault: PostgreSQL is
// stopped for three minutes (STEWARD_E2E_OUTAGE shortens it) while three
// generations of one machine's grant are published, a third of the way
// apart. Invariant: nothing is dead-lettered however long the outage lasts
// (the old runtime dead-lettered all three after MaxDeliver and nothing
// applied once PostgreSQL was back); when PostgreSQL returns, the newest
// generation applies with no command from anyone, the two older ones are
// superseded (never applied after it), and the DLQ is empty.
func TestFaultPostgresDownForMinutes(t *testing.T) {
	const machine = "m3"
	outage := 3 * time.Minute
	if v := os.Getenv("STEWARD_E2E_OUTAGE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("STEWARD_E2E_OUTAGE=%q: %v", v, err)
		}
		outage = d
	}
	// An operator's cap on the wait between attempts; the delivery
	// budget stays the default.
	f := startProvisionFault(t, machine, map[string]string{"STEWARD_MAX_BACKOFF": "10s"})
	pg, b, w, signingKey, recipient := f.pg, f.b, f.w, f.signingKey, f.recipient

	pg.stop(t)
	stopped := time.Now()
	gens := []uint64{2, 3, 4}
	ids := map[uint64]string{}
	published := 0
	// The outage is the fault, not a stand-in for synchronisation: while
	// it lasts, every poll checks that nothing was dead-lettered or
	// applied, and publishes the next generation when its time comes.
	waitFor(t, fmt.Sprintf("PostgreSQL has been down for %v", outage), outage+time.Minute, func() (bool, string) {
		down := time.Since(stopped)
		for published < len(gens) && down >= time.Duration(published)*outage/3 {
			g := grant(t, signingKey, recipient, machine, gens[published], "orders", fmt.Sprintf("svc%d", gens[published]))
			b.publish(t, g)
			ids[gens[published]] = g.ID()
			published++
		}
		if dead := b.deadLetters(t, "provision", machine); len(dead) != 0 {
			t.Fatalf("dead-lettered during the outage after %v: %s", down.Round(time.Second), dead[0].Reason)
		}
		outs := outcomesByCause(t, b, "provision", machine)
		for _, g := range gens {
			for _, o := range outs[ids[g]] {
				if o.Type() == "dev.steward.grant.applied.v1" {
					t.Fatalf("generation %d applied while PostgreSQL was down", g)
				}
			}
		}
		return published == len(gens) && down >= outage, fmt.Sprintf("down %v, %d generations published", down.Round(time.Second), published)
	})
	retried, err := w.metric("steward_events_total", `worker="provision"`, `result="retried"`)
	if err != nil {
		t.Fatal(err)
	}
	pg.start(t)
	restarted := time.Now()
	newest := waitOutcome(t, b, "provision", machine, ids[4], 2*time.Minute)
	recovered := time.Since(restarted)
	if newest.Type() != "dev.steward.grant.applied.v1" {
		t.Fatalf("generation 4: outcome %s (%s); want applied", newest.Type(), newest.Data())
	}
	waitFor(t, "provision-"+machine+" has settled every event", time.Minute, func() (bool, string) {
		return b.consumerIdle("provision-" + machine)
	})

	outs := outcomesByCause(t, b, "provision", machine)
	for _, g := range []uint64{2, 3} {
		if len(outs[ids[g]]) != 1 || outs[ids[g]][0].Type() != "dev.steward.grant.superseded.v1" {
			t.Errorf("generation %d: outcomes %v; want one grant.superseded", g, outs[ids[g]])
		}
	}
	if len(outs[ids[4]]) != 1 {
		t.Errorf("generation 4 has %d outcomes; want 1", len(outs[ids[4]]))
	}
	if dead := b.deadLetters(t, "provision", machine); len(dead) != 0 {
		t.Errorf("%d dead letters; want none", len(dead))
	}
	recorded := pg.query(t, `SELECT generation FROM steward.provision_generation WHERE machine = $1`, machine)
	if !slices.Equal(recorded, []string{"4"}) {
		t.Errorf("recorded generation %v; want [4]", recorded)
	}
	roles := pg.query(t, `SELECT rolname FROM pg_roles WHERE rolname LIKE 'mesh\_%' AND rolcanlogin ORDER BY 1`)
	if want := []string{"mesh_orders", "mesh_svc4"}; !slices.Equal(roles, want) {
		t.Errorf("roles with login %v; want %v (generation 4 exactly)", roles, want)
	}

	summary(t, "fault-postgres-down-for-minutes",
		"outage", round(outage), "generations_published_while_down", len(gens), "retried_while_down", retried,
		"dead_lettered", 0, "applied_after_recovery", 1, "superseded", 2, "recover", round(recovered))
}
