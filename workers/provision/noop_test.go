package provision

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/steward-dev/steward/events"
)

// fixture200 is 200 granted consumers, shared by the no-op test and its
// benchmark: creating 200 databases and dropping them again costs the
// server minutes, so it is done once per test binary and dropped in
// TestMain.
var fixture200 struct {
	once  sync.Once
	e     *env
	w     *Worker
	st    *statements
	grant events.GrantChanged
	first time.Duration
}

func noop200(tb testing.TB) {
	tb.Helper()
	fixture200.once.Do(func() {
		e := openEnv(tb, testURL())
		fixture200.e = e
		st := &statements{}
		w, err := newWorker(Config{Machine: testMachine, AgeIdentity: e.idPath, DatabaseURL: e.url, RolePrefix: e.prefix, ControllerKey: testControllerPub}, st)
		if err != nil {
			tb.Fatal(err)
		}
		fixture200.w, fixture200.st = w, st
		gs := make([]giv, 200)
		for i := range gs {
			node := fmt.Sprintf("c%03d", i)
			gs[i] = giv{node, e.db(node), "password-" + node + "-" + randomHex(8)}
		}
		fixture200.grant = e.grant(1, gs...)
		start := time.Now()
		out := apply(tb, w, fixture200.grant)
		fixture200.first = time.Since(start)
		if len(out.Created.Roles) != 200 || len(out.Created.Databases) != 200 {
			tb.Fatalf("the first reconcile created %d roles and %d databases, want 200 each", len(out.Created.Roles), len(out.Created.Databases))
		}
	})
	if fixture200.w == nil {
		tb.Fatal("the 200-consumer fixture failed to build in an earlier test")
	}
}

func cleanupFixture200() {
	if fixture200.e == nil {
		return
	}
	if fixture200.w != nil {
		fixture200.w.Close()
	}
	if err := fixture200.e.drop(); err != nil {
		fmt.Fprintln(os.Stderr, "drop the 200-consumer fixture:", err)
	}
}

// nextNoop reconciles the fixture's unchanged consumers under a new
// generation, so the whole reconcile runs rather than the generation skip.
func nextNoop(tb testing.TB) *Applied {
	tb.Helper()
	fixture200.grant.Generation++
	fixture200.grant = signGrant(tb, fixture200.grant)
	fixture200.st.reset()
	return apply(tb, fixture200.w, fixture200.grant)
}

// TestNoopReconcile200 reconciles 200 unchanged consumers and checks that
// not one DDL statement reaches the server.
func TestNoopReconcile200(t *testing.T) {
	noop200(t)
	start := time.Now()
	out := nextNoop(t)
	elapsed := time.Since(start)
	if ddl := fixture200.st.ddl(); len(ddl) != 0 {
		t.Fatalf("a no-op reconcile sent %d DDL statements, e.g. %q", len(ddl), ddl[0])
	}
	if len(out.Unchanged.Roles) != 200 || len(out.Unchanged.Databases) != 200 ||
		len(out.Created.Roles)+len(out.Created.Databases)+len(out.Altered.Roles)+len(out.Revoked.Roles) != 0 {
		t.Fatalf("a no-op reconcile reported %+v", out)
	}
	t.Logf("first reconcile of 200 consumers: %v; no-op reconcile: %v, %d statements, 0 DDL", fixture200.first.Round(time.Millisecond), elapsed.Round(time.Millisecond), fixture200.st.count())
}

// BenchmarkNoopReconcile200 times a reconcile of 200 unchanged consumers:
// lock, generation, 200 decryptions and verifier checks, two catalog
// reads, the generation write.
func BenchmarkNoopReconcile200(b *testing.B) {
	noop200(b)
	for b.Loop() {
		nextNoop(b)
		if ddl := fixture200.st.ddl(); len(ddl) != 0 {
			b.Fatalf("a no-op reconcile sent DDL %q", ddl)
		}
	}
}
