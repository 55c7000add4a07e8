package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/devstack"
	"github.com/steward-dev/steward/internal/natsauth"
	"github.com/steward-dev/steward/internal/pgserver"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers/converge"
	"github.com/steward-dev/steward/workers/credential"
	"github.com/steward-dev/steward/workers/join"
	"github.com/steward-dev/steward/workers/provision"
	"github.com/steward-dev/steward/workers/workertest"
)

// devRun is a running `steward dev` and what it printed.
type devRun struct {
	p       *proc
	natsURL string
	ingress string
	token   string
	// operatorCreds and publisherCreds are the credentials files dev
	// printed: the bus is closed, so every client needs one.
	operatorCreds, publisherCreds string
}

// env is what dev says to export for the steward commands.
func (d devRun) env() []string {
	return []string{"STEWARD_NATS_URL=" + d.natsURL, "STEWARD_NATS_CREDS=" + d.operatorCreds}
}

func startDev(t *testing.T, dir string) devRun {
	t.Helper()
	return startDevWith(t, nil, dir)
}

// startDevWith starts `steward dev` on dir with extra environment
// variables and flags.
func startDevWith(t *testing.T, env []string, dir string, flags ...string) devRun {
	t.Helper()
	args := append([]string{"dev", "--dir", dir, "--nats-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"}, flags...)
	p := start(t, env, args...)
	p.waitLine(t, "steward dev is running")
	lines := p.snapshot()
	d := devRun{p: p}
	// The NATS URL comes first, before anything that could fail later.
	first, ok := strings.CutPrefix(lines[0], "NATS with JetStream: ")
	if !ok || !strings.HasPrefix(first, "nats://127.0.0.1:") {
		t.Fatalf("first line %q does not give the NATS URL", lines[0])
	}
	d.natsURL = strings.Fields(first)[0]
	export := regexp.MustCompile(`^  export STEWARD_NATS_URL=(\S+) STEWARD_NATS_CREDS=(\S+) `).FindStringSubmatch(lines[1])
	if export == nil || export[1] != d.natsURL {
		t.Fatalf("second line %q does not say what to export", lines[1])
	}
	d.operatorCreds = export[2]
	pubs := regexp.MustCompile(`^  publishers: (\S+) `).FindStringSubmatch(p.waitLine(t, "  publishers: "))
	if pubs == nil {
		t.Fatal("dev printed no publishers' credentials")
	}
	d.publisherCreds = pubs[1]
	ing := p.waitLine(t, "ingress: POST ")
	f := strings.Fields(ing)
	d.ingress, d.token = f[2], strings.TrimSuffix(f[5], ",")
	return d
}

func connectJS(t *testing.T, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	return connectCreds(t, url, "")
}

// connectCreds connects with a credentials file (none when creds is
// empty) and the inbox prefix it allows, as steward's --nats-creds does.
func connectCreds(t *testing.T, url, creds string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	var opts []nats.Option
	if creds != "" {
		raw, err := os.ReadFile(creds)
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, nats.UserCredentials(creds))
		if p := natsauth.CredsInboxPrefix(raw); p != "" {
			opts = append(opts, nats.CustomInboxPrefix(p))
		}
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// plainEvent is a release event as a program that is not Steward sends it:
// headers set by hand, core NATS publish.
func plainEvent(id, version, data string) *nats.Msg {
	m := nats.NewMsg("steward.events.release.published")
	m.Header.Set("ce-specversion", "1.0")
	m.Header.Set("ce-type", events.TypeReleasePublished)
	m.Header.Set("ce-source", "/not-steward")
	m.Header.Set("ce-id", id)
	m.Header.Set("ce-subject", version)
	m.Header.Set("content-type", "application/json")
	m.Data = []byte(data)
	return m
}

func outcomeOf(t *testing.T, js jetstream.JetStream, worker, instance, causation string) *struct{ typ, data string } {
	t.Helper()
	for _, o := range workertest.Outcomes(t, js, worker, instance) {
		if c, _ := o.Extensions()["causationid"].(string); c == causation {
			return &struct{ typ, data string }{o.Type(), string(o.Data())}
		}
	}
	return nil
}

// waitOutcome waits for the outcome a worker emitted for event id.
func waitOutcome(t *testing.T, js jetstream.JetStream, worker, instance, id string) (string, string) {
	t.Helper()
	var got *struct{ typ, data string }
	workertest.WaitUntil(t, worker+" emits an outcome for "+id, func() bool {
		got = outcomeOf(t, js, worker, instance, id)
		return got != nil
	})
	return got.typ, got.data
}

// TestDev runs `steward dev` as a newcomer would and proves: the NATS URL
// is printed first; an event published with plain NATS headers by a
// program that is not Steward is accepted, validated and handled (the
// outcome is read from STEWARD_OUTCOMES); malformed ones land in the DLQ
// with a reason naming the problem; the ingress, metrics and health answer;
// the publish lines the workers print work as printed; SIGINT stops it
// cleanly; and a second run reuses the store and the token.
func TestDev(t *testing.T) {
	dir := t.TempDir()
	d := startDev(t, dir)
	_, js := connectCreds(t, d.natsURL, d.operatorCreds)
	// Events come from a publisher's identity, as from a console.
	nc, _ := connectCreds(t, d.natsURL, d.publisherCreds)

	raw, err := os.ReadFile(filepath.Join(dir, devstack.TokenFile))
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(raw)) != d.token || len(d.token) < 32 {
		t.Fatalf("token file holds %q, dev printed %q", raw, d.token)
	}
	if fi, _ := os.Stat(filepath.Join(dir, devstack.TokenFile)); fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file mode %v, want 0600", fi.Mode().Perm())
	}

	// Every line dev prints works as printed: TestDevPrintedLines.

	// 1. Plain headers, core NATS: accepted and handled.
	if err := nc.PublishMsg(plainEvent("plain-1.1.0", "1.1.0", `{"version":"1.1.0"}`)); err != nil {
		t.Fatal(err)
	}
	typ, data := waitOutcome(t, js, converge.Name, converge.DevInstall, "plain-1.1.0")
	if typ != "dev.steward.converge.succeeded.v1" || !strings.Contains(data, `"1.1.0"`) {
		t.Fatalf("outcome %s %s", typ, data)
	}

	// 2. Malformed: an unknown field, a bad version, and no CloudEvent at all.
	if err := nc.PublishMsg(plainEvent("bad-field", "1.2.0", `{"version":"1.2.0","image":"evil/ops:latest"}`)); err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishMsg(plainEvent("bad-version", "1.2", `{"version":"1.2"}`)); err != nil {
		t.Fatal(err)
	}
	notCE := nats.NewMsg("steward.events.release.published")
	notCE.Data = []byte(`{"version":"1.2.0"}`)
	if err := nc.PublishMsg(notCE); err != nil {
		t.Fatal(err)
	}
	var dls []events.DeadLetter
	workertest.WaitUntil(t, "three dead letters for converge-dev", func() bool {
		dls = workertest.DeadLetters(t, js, converge.Name, converge.DevInstall)
		return len(dls) == 3
	})
	// Invalid events skip the key lanes, so they reach the DLQ in any order.
	slices.SortFunc(dls, func(a, b events.DeadLetter) int { return cmp.Compare(a.Sequence, b.Sequence) })
	for i, want := range [][]string{{"image"}, {"/version"}, {"not a CloudEvent", "ce-specversion"}} {
		for _, w := range want {
			if !strings.Contains(dls[i].Reason, w) {
				t.Fatalf("dead letter %d: reason %q does not name %q", i, dls[i].Reason, w)
			}
		}
		if dls[i].Delivered != 1 {
			t.Fatalf("dead letter %d after %d deliveries, want the first", i, dls[i].Delivered)
		}
	}

	// 3. The ingress, with the printed token, feeds the same workers.
	req, _ := http.NewRequest(http.MethodPost, d.ingress, strings.NewReader(`{"version":"1.2.0"}`))
	for k, v := range map[string]string{
		"Authorization": "Bearer " + d.token, "ce-specversion": "1.0", "ce-type": events.TypeReleasePublished,
		"ce-source": "/console", "ce-id": "http-1.2.0", "ce-subject": "1.2.0", "content-type": "application/json",
	} {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("ingress: %d %s", resp.StatusCode, body)
	}
	if typ, data := waitOutcome(t, js, converge.Name, converge.DevInstall, "http-1.2.0"); typ != "dev.steward.converge.succeeded.v1" || !strings.Contains(data, `"1.2.0"`) {
		t.Fatalf("outcome %s %s", typ, data)
	}
	base := strings.TrimSuffix(d.ingress, publisher.IngressPath)
	for path, want := range map[string]string{"/healthz": "ok", "/readyz": "ready", "/metrics": "steward_events_total"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), want) {
			t.Fatalf("%s: %d %.200s", path, resp.StatusCode, b)
		}
	}

	// 4. The publish lines the credential and join workers print work as
	// printed (with STEWARD_NATS_URL exported, as dev says).
	for _, worker := range []string{credential.Name, join.Name} {
		for _, line := range publishLines(t, d.p.snapshot(), worker) {
			sh := strings.Replace(line, "go run ./cmd/steward", bin, 1)
			cmd := exec.Command("sh", "-c", sh)
			cmd.Env = cleanEnv(d.env()...)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s line %q: %v\n%s", worker, line, err, out)
			}
		}
	}
	workertest.WaitUntil(t, "credential dev-hive applied", func() bool {
		for _, o := range workertest.Outcomes(t, js, credential.Name, credential.DevHive) {
			if o.Type() == "dev.steward.credential.applied.v1" {
				return true
			}
		}
		return false
	})
	secret, err := os.ReadFile(filepath.Join(dir, "credential", "files", credential.SecretFile))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(filepath.Join(dir, "credential", "dev-secret.txt"))
	if string(secret) != string(want) || len(secret) == 0 {
		t.Fatalf("secret file %q, want the dev secret", secret)
	}
	workertest.WaitUntil(t, "join dev-box armed", func() bool {
		for _, o := range workertest.Outcomes(t, js, join.Name, join.DevBox) {
			if o.Type() == "dev.steward.join.armed.v1" {
				return true
			}
		}
		return false
	})

	// 5. join status reads the same box through the join flags' env twins.
	cfg, _, err := join.Dev(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	st := ok(t, []string{
		"STEWARD_BOX=" + cfg.Box, "STEWARD_DEPLOYMENT=" + cfg.Deployment,
		"STEWARD_CONSOLE_KEY=" + cfg.ConsoleKey, "STEWARD_RELEASE_KEY=" + cfg.ReleaseKey,
		"STEWARD_IDENTITY_RECORD=" + cfg.IdentityRecord, "STEWARD_INSTANCE_ID_FILE=" + cfg.InstanceIDFile,
		"STEWARD_OPT_DIR=" + cfg.OptDir, "STEWARD_ARM_COMMAND=" + cfg.ArmCommand, "STEWARD_ARMED_MARKER=" + cfg.ArmedMarker,
	}, "join", "status")
	if !strings.Contains(st.stdout, "box dev-box (deployment dev): armed") {
		t.Fatalf("join status:\n%s", st.stdout)
	}

	// 6. SIGINT stops it cleanly; a second run reuses store and token.
	if code := d.p.stop(t, syscall.SIGINT); code != 0 {
		t.Fatalf("dev exited %d after SIGINT", code)
	}
	nc.Close()
	d2 := startDev(t, dir)
	if d2.token != d.token {
		t.Fatalf("second run printed token %q, want the kept %q", d2.token, d.token)
	}
	_, js2 := connectCreds(t, d2.natsURL, d2.operatorCreds)
	s, err := js2.Stream(context.Background(), events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n < 5 {
		t.Fatalf("%d events kept across the restart, want at least 5", n)
	}
	if code := d2.p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("dev exited %d after SIGTERM", code)
	}
}

// publishLines returns the `steward publish` lines dev printed under a
// worker's "is running" line.
func publishLines(t *testing.T, lines []string, worker string) []string {
	t.Helper()
	var out []string
	in := false
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, worker+" is running"):
			in = true
		case !strings.HasPrefix(l, "  "):
			in = false
		case in && strings.Contains(l, "go run ./cmd/steward --context "+devPublisherContext+" publish"):
			out = append(out, strings.TrimSpace(l[strings.Index(l, "go run ./cmd/steward"):]))
		}
	}
	if len(out) == 0 {
		t.Fatalf("dev printed no publish line for %s:\n%s", worker, strings.Join(lines, "\n"))
	}
	return out
}

// TestDevRefuses4222 proves dev never takes the port of a real NATS.
func TestDevRefuses4222(t *testing.T) {
	r := run(t, nil, "dev", "--dir", t.TempDir(), "--nats-listen", "127.0.0.1:4222")
	if r.code == 0 || !strings.Contains(r.stderr, "4222") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
}

// pgBinOrSkip is the machine's PostgreSQL server binaries, or skips.
func pgBinOrSkip(t *testing.T) string {
	t.Helper()
	bin, err := pgserver.FindBin("")
	if err != nil {
		workertest.Requires(t, "PostgreSQL's server binaries", err)
	}
	return bin
}

// reachableDir is a dev --dir the postgres user can reach when the tests
// run as root: t.TempDir's parents are 0700.
func reachableDir(t *testing.T) string {
	t.Helper()
	root, err := pgserver.TempDir("steward-dev-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	return filepath.Join(root, "dev")
}

// stopLeftPostgres stops, when the test ends, a server left running in a
// cluster folder (a dev the harness had to kill leaves one), so that no
// test leaves a postgres behind.
func stopLeftPostgres(t *testing.T, clusterDir string) {
	t.Cleanup(func() {
		raw, err := os.ReadFile(filepath.Join(clusterDir, "data", "postmaster.pid"))
		if err != nil {
			return
		}
		pid, _ := strconv.Atoi(strings.SplitN(string(raw), "\n", 2)[0])
		if pid <= 0 || syscall.Kill(pid, syscall.SIGINT) != nil {
			return
		}
		workertest.WaitUntil(t, "the left postgres exits", func() bool { return syscall.Kill(pid, 0) != nil })
	})
}

// sharedServer is the machine's PostgreSQL on 127.0.0.1:5432, where the
// tests of other packages run; nil when nothing answers there.
type sharedServer struct{ conn *pgx.Conn }

// openSharedServer connects to 127.0.0.1:5432 and holds, for the test,
// the advisory lock workers/provision's TestDev holds while it makes and
// drops role mesh_app there, so that what this test reads is not that
// test's doing.
func openSharedServer(t *testing.T) *sharedServer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable&connect_timeout=3")
	if err != nil {
		t.Logf("no shared PostgreSQL on 127.0.0.1:5432 (%v): nothing there to leave untouched", err)
		return nil
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	lctx, lcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer lcancel()
	if _, err := conn.Exec(lctx, "SELECT pg_catalog.pg_advisory_lock(pg_catalog.hashtextextended('steward.provision.TestDev', 0))"); err != nil {
		t.Fatal(err)
	}
	return &sharedServer{conn: conn}
}

// state is what dev's provisioning would make on a server: role mesh_app,
// database app (by oid, so that a drop and remake shows) and dev-db's
// generation row.
func (s *sharedServer) state(t *testing.T) string {
	t.Helper()
	if s == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var role, db, gen string
	err := s.conn.QueryRow(ctx, `SELECT
		coalesce((SELECT oid::text FROM pg_catalog.pg_roles WHERE rolname = 'mesh_app'), 'no role'),
		coalesce((SELECT oid::text FROM pg_catalog.pg_database WHERE datname = 'app'), 'no database')`).Scan(&role, &db)
	if err != nil {
		t.Fatal(err)
	}
	gen = "no generation table"
	var table bool
	if err := s.conn.QueryRow(ctx, "SELECT to_regclass('steward.provision_generation') IS NOT NULL").Scan(&table); err != nil {
		t.Fatal(err)
	}
	if table {
		err := s.conn.QueryRow(ctx, "SELECT coalesce((SELECT generation::text FROM steward.provision_generation WHERE machine = $1 AND prefix = 'mesh_'), 'no row')", provision.DevMachine).Scan(&gen)
		if err != nil {
			t.Fatal(err)
		}
	}
	return fmt.Sprintf("role mesh_app %s, database app %s, dev-db generation %s", role, db, gen)
}

// pgLine is dev's "PostgreSQL: 127.0.0.1:<port>, a private cluster in
// <dir> (<state>...)" line.
var pgLine = regexp.MustCompile(`^PostgreSQL: 127\.0\.0\.1:(\d+), a private cluster in (\S+) \(([^,;)]+)`)

// privatePG reads the port, folder and state ("made now", "reused") dev
// printed for its private cluster.
func privatePG(t *testing.T, d devRun) (port int, dir, state, line string) {
	t.Helper()
	line = d.p.waitLine(t, "PostgreSQL: ")
	m := pgLine.FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("the PostgreSQL line %q does not name a private cluster", line)
	}
	port, _ = strconv.Atoi(m[1])
	return port, m[2], m[3], line
}

// publishGrant publishes provision's grant as dev's printed line does and
// waits for its outcome.
func publishGrant(t *testing.T, d devRun, js jetstream.JetStream) string {
	t.Helper()
	before := len(workertest.Outcomes(t, js, provision.Name, provision.DevMachine))
	for _, line := range publishLines(t, d.p.snapshot(), provision.Name) {
		cmd := exec.Command("sh", "-c", strings.Replace(line, "go run ./cmd/steward", bin, 1))
		cmd.Env = cleanEnv(d.env()...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("provision line %q: %v\n%s", line, err, out)
		}
	}
	var typ string
	workertest.WaitUntil(t, "provision emits an outcome for the grant", func() bool {
		outs := workertest.Outcomes(t, js, provision.Name, provision.DevMachine)
		if len(outs) > before {
			typ = outs[len(outs)-1].Type()
			return true
		}
		return false
	})
	return typ
}

// connectLine connects as dev's printed "then connect" psql line says,
// with the development password, and returns who and where it is.
func connectLine(t *testing.T, d devRun, dir string) string {
	t.Helper()
	line := d.p.waitLine(t, "then connect: ")
	m := regexp.MustCompile(`psql "([^"]+)"`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("no psql connection string in %q", line)
	}
	password, err := os.ReadFile(filepath.Join(dir, provision.Name, "app-password"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, m[1]+" sslmode=disable password="+strings.TrimSpace(string(password)))
	if err != nil {
		t.Fatalf("connect as the printed line %q says: %v", line, err)
	}
	defer conn.Close(ctx)
	var who string
	if err := conn.QueryRow(ctx, "SELECT current_user || '@' || current_database() || ':' || current_setting('port')").Scan(&who); err != nil {
		t.Fatal(err)
	}
	return who
}

func answersOn(port int) bool {
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
	if err == nil {
		c.Close()
	}
	return err == nil
}

// TestDevPostgres proves issue 14 fixed: `steward dev` makes and runs a
// private PostgreSQL under --dir (127.0.0.1, its own port, as the postgres
// user when root), its printed grant lands there (the role logs in as the
// printed psql line says, on that port), and the machine's shared server
// on 5432 is left as it was. SIGTERM stops the cluster with dev; a second
// start reuses it (same port, the role still there); after a SIGKILL of
// dev the next start stops the orphaned server and runs again.
func TestDevPostgres(t *testing.T) {
	pgBinOrSkip(t)
	shared := openSharedServer(t)
	sharedBefore := shared.state(t)
	dir := reachableDir(t)
	clusterDir, _ := filepath.Abs(filepath.Join(dir, "postgres"))
	stopLeftPostgres(t, clusterDir)

	began := time.Now()
	d := startDev(t, dir)
	port, where, state, line := privatePG(t, d)
	t.Logf("dev up with a new cluster in %v: %s", time.Since(began), line)
	if where != clusterDir || state != "made now" || port == 5432 {
		t.Fatalf("PostgreSQL line %q: want a cluster made now in %s, not on 5432", line, clusterDir)
	}
	if os.Geteuid() == 0 && !strings.Contains(line, "run as the postgres user") {
		t.Fatalf("running as root, the line %q does not say the server runs as postgres", line)
	}
	d.p.waitLine(t, "provision is running")
	_, js := connectCreds(t, d.natsURL, d.operatorCreds)
	if typ := publishGrant(t, d, js); typ != "dev.steward.grant.applied.v1" {
		t.Fatalf("the grant's outcome is %s", typ)
	}
	if who := connectLine(t, d, dir); who != fmt.Sprintf("mesh_app@app:%d", port) {
		t.Fatalf("the printed psql line connects as %s, want mesh_app@app on the private port %d", who, port)
	}
	if after := shared.state(t); after != sharedBefore {
		t.Fatalf("the shared server on 5432 changed: before %q, after %q", sharedBefore, after)
	}

	if code := d.p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("dev exited %d after SIGTERM", code)
	}
	if !strings.Contains(d.p.output(), "PostgreSQL stopped") || answersOn(port) {
		t.Fatalf("after SIGTERM PostgreSQL still answers on %d (%v) or dev did not say it stopped it", port, answersOn(port))
	}

	// Reused: no initdb, the same port, the grant's role still there.
	began = time.Now()
	d2 := startDev(t, dir)
	port2, _, state2, line2 := privatePG(t, d2)
	t.Logf("dev up with its kept cluster in %v: %s", time.Since(began), line2)
	if state2 != "reused" || port2 != port {
		t.Fatalf("second start: %q, want the cluster reused on %d", line2, port)
	}
	d2.p.waitLine(t, "provision is running")
	if who := connectLine(t, d2, dir); who != fmt.Sprintf("mesh_app@app:%d", port) {
		t.Fatalf("after a restart the role connects as %s", who)
	}

	// Killed: the server outlives dev; the next start stops it and runs.
	if err := d2.p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-d2.p.done
	if !answersOn(port) {
		t.Fatal("the server did not outlive a SIGKILL of dev, so this part proves nothing")
	}
	d3 := startDev(t, dir)
	_, _, _, line3 := privatePG(t, d3)
	if !strings.Contains(line3, "left running") {
		t.Fatalf("after a killed dev: %q, want it to say it stopped the server left running", line3)
	}
	d3.p.waitLine(t, "provision is running")
	if who := connectLine(t, d3, dir); !strings.HasPrefix(who, "mesh_app@app:") {
		t.Fatalf("after recovery the role connects as %s", who)
	}
	if code := d3.p.stop(t, syscall.SIGINT); code != 0 {
		t.Fatalf("dev exited %d after SIGINT", code)
	}
	if after := shared.state(t); after != sharedBefore {
		t.Fatalf("the shared server on 5432 changed: before %q, after %q", sharedBefore, after)
	}
}

// TestDevDatabaseURL proves --database-url points provision at that server
// and dev starts no PostgreSQL of its own.
func TestDevDatabaseURL(t *testing.T) {
	bin := pgBinOrSkip(t)
	shared := openSharedServer(t)
	sharedBefore := shared.state(t)
	other := reachableDir(t)
	srv, err := pgserver.Start(context.Background(), pgserver.Options{Bin: bin, Dir: other, Settings: map[string]string{"fsync": "off"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })

	dir := t.TempDir()
	d := startDevWith(t, nil, dir, "--database-url", srv.URL("postgres"))
	line := d.p.waitLine(t, "PostgreSQL: ")
	if want := fmt.Sprintf("PostgreSQL: 127.0.0.1:%d as postgres, database postgres, from --database-url", srv.Port); !strings.HasPrefix(line, want) {
		t.Fatalf("PostgreSQL line %q, want %q", line, want)
	}
	if _, err := os.Stat(filepath.Join(dir, "postgres")); !os.IsNotExist(err) {
		t.Fatalf("dev made a cluster folder though --database-url was given: %v", err)
	}
	d.p.waitLine(t, "provision is running")
	_, js := connectCreds(t, d.natsURL, d.operatorCreds)
	if typ := publishGrant(t, d, js); typ != "dev.steward.grant.applied.v1" {
		t.Fatalf("the grant's outcome is %s", typ)
	}
	if who := connectLine(t, d, dir); who != fmt.Sprintf("mesh_app@app:%d", srv.Port) {
		t.Fatalf("the role connects as %s, want mesh_app@app on the --database-url server's port %d", who, srv.Port)
	}
	if code := d.p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("dev exited %d after SIGTERM", code)
	}
	if !answersOn(srv.Port) {
		t.Fatal("dev stopped the --database-url server, which is not its own")
	}
	if after := shared.state(t); after != sharedBefore {
		t.Fatalf("the shared server on 5432 changed: before %q, after %q", sharedBefore, after)
	}
}

// TestDevNoPostgres proves that with no server binaries (STEWARD_PG_BIN,
// --pg-bin's twin, names an empty folder) and no --database-url dev says
// so, runs the other three workers, and never falls back to 5432 even
// with the libpq variables naming it; and that a --database-url where
// nothing answers is named without its password.
func TestDevNoPostgres(t *testing.T) {
	empty := t.TempDir()
	d := startDevWith(t, []string{"STEWARD_PG_BIN=" + empty, "PGHOST=127.0.0.1", "PGPORT=5432", "PGUSER=postgres"}, t.TempDir())
	line := d.p.waitLine(t, "PostgreSQL: ")
	if !strings.HasPrefix(line, "PostgreSQL: none; --pg-bin "+empty+" holds no initdb") || !strings.Contains(line, "--database-url") {
		t.Fatalf("PostgreSQL line %q, want none, naming the empty --pg-bin and --database-url", line)
	}
	not := d.p.waitLine(t, "provision is not running")
	if !strings.Contains(not, "it needs PostgreSQL") || strings.Count(not, "is not running") != 1 {
		t.Fatalf("provision line %q", not)
	}
	for _, w := range []string{converge.Name, join.Name, credential.Name} {
		d.p.waitLine(t, w+" is running")
	}
	if code := d.p.stop(t, syscall.SIGINT); code != 0 {
		t.Fatalf("dev exited %d after SIGINT", code)
	}

	// A --database-url where nothing answers is named, with what to do.
	d = startDevWith(t, nil, t.TempDir(), "--database-url", "postgres://postgres:hunter2@127.0.0.1:1/postgres")
	not = d.p.waitLine(t, "provision is not running")
	if !strings.Contains(not, "PostgreSQL at 127.0.0.1:1 as postgres does not answer") || !strings.Contains(not, "start that server") || strings.Contains(d.p.output(), "hunter2") {
		t.Fatalf("provision line %q (and no password printed anywhere)", not)
	}
	if code := d.p.stop(t, syscall.SIGINT); code != 0 {
		t.Fatalf("dev exited %d after SIGINT", code)
	}
}

// watchedConn connects with creds and reports the permission violations
// the server sends it on the returned channel.
func watchedConn(t *testing.T, url, creds string) (*nats.Conn, <-chan string) {
	t.Helper()
	raw, err := os.ReadFile(creds)
	if err != nil {
		t.Fatal(err)
	}
	denied := make(chan string, 16)
	nc, err := nats.Connect(url, nats.UserCredentials(creds), nats.CustomInboxPrefix(natsauth.CredsInboxPrefix(raw)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { denied <- err.Error() }))
	if err != nil {
		t.Fatalf("connect with %s: %v", creds, err)
	}
	t.Cleanup(nc.Close)
	return nc, denied
}

// refusedPublish publishes to subject and waits for the server to say it
// refused it.
func refusedPublish(t *testing.T, nc *nats.Conn, denied <-chan string, subject string) {
	t.Helper()
	if err := nc.Publish(subject, []byte(`{"forged":true}`)); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(5 * time.Second)
	for {
		select {
		case msg := <-denied:
			if strings.Contains(msg, "Permissions Violation") && strings.Contains(msg, `"`+subject+`"`) {
				return
			}
		case <-timeout:
			t.Fatalf("the server did not refuse a publish to %s", subject)
		}
	}
}

// TestDevAuth proves dev's bus is closed: a connection without
// credentials is refused and steward says what to set; the credentials
// files dev wrote are 0600 and the nats CLI line names them; the
// publisher cannot forge a checkpoint; a worker instance cannot publish
// events or write another instance's keys; and credentials issued with
// `steward creds issue` from dev's signing key work on dev's server with
// no change to it (the fleet path).
func TestDevAuth(t *testing.T) {
	dir := t.TempDir()
	d := startDev(t, dir)

	if nc, err := nats.Connect(d.natsURL); err == nil {
		nc.Close()
		t.Fatal("dev's NATS accepted a connection without credentials")
	}
	r := run(t, []string{"STEWARD_NATS_URL=" + d.natsURL}, "status")
	if r.code == 0 || !strings.Contains(r.stderr, "STEWARD_NATS_CREDS") || !strings.Contains(r.stderr, "Authorization Violation") {
		t.Fatalf("status without credentials: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := ok(t, d.env(), "status"); !strings.Contains(r.stdout, events.StreamEvents) {
		t.Fatalf("status as the operator:\n%s", r.stdout)
	}

	cli := d.p.waitLine(t, "  nats --server ")
	if want := fmt.Sprintf("  nats --server %s --creds %s stream ls", d.natsURL, d.operatorCreds); !strings.HasPrefix(cli, want) {
		t.Fatalf("nats CLI line %q, want %q", cli, want)
	}
	workerCreds := filepath.Join(dir, devstack.CredsDir, converge.Name+"-"+converge.DevInstall+".creds")
	for _, f := range []string{d.operatorCreds, d.publisherCreds, workerCreds, filepath.Join(dir, devstack.AuthDir, natsauth.SigningSeedFile)} {
		if fi, err := os.Stat(f); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v (%v); want a 0600 file", f, fi, err)
		}
	}
	for _, f := range []string{natsauth.OperatorSeedFile, natsauth.AccountSeedFile, natsauth.SigningSeedFile, natsauth.SystemSeedFile} {
		seed, err := os.ReadFile(filepath.Join(dir, devstack.AuthDir, f))
		if err != nil || len(seed) < 50 {
			t.Fatalf("%s: %v", f, err)
		}
		if strings.Contains(d.p.output(), strings.TrimSpace(string(seed))) {
			t.Fatalf("dev printed the seed of %s", f)
		}
	}

	_, js := connectCreds(t, d.natsURL, d.operatorCreds)
	kv, err := js.KeyValue(context.Background(), events.CheckpointBucket)
	if err != nil {
		t.Fatal(err)
	}
	cp := "cp." + converge.Name + "." + converge.DevInstall + ".forged"
	pub, pubDenied := watchedConn(t, d.natsURL, d.publisherCreds)
	refusedPublish(t, pub, pubDenied, "$KV."+events.CheckpointBucket+"."+cp)
	refusedPublish(t, pub, pubDenied, "$JS.API.STREAM.INFO."+events.StreamEvents)
	if _, err := kv.Get(context.Background(), cp); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the publisher's forged checkpoint: %v", err)
	}

	w, wDenied := watchedConn(t, d.natsURL, workerCreds)
	refusedPublish(t, w, wDenied, "steward.events.release.published")
	refusedPublish(t, w, wDenied, "$KV."+events.CheckpointBucket+".cp."+join.Name+"."+join.DevBox+".invitation")
	refusedPublish(t, w, wDenied, "$KV."+events.CheckpointBucket+".rt."+credential.Name+"."+credential.DevHive)

	// The fleet path: a new instance's credentials from the signing key
	// alone; dev's server trusts them as they are.
	issued := filepath.Join(t.TempDir(), "converge-install-7.creds")
	r = ok(t, nil, "creds", "issue", converge.Name, "install-7",
		"--account-seed", filepath.Join(dir, devstack.AuthDir, natsauth.SigningSeedFile), "--out", issued)
	if !strings.Contains(r.stdout, issued) || strings.Contains(r.stdout+r.stderr, "SU") {
		t.Fatalf("creds issue printed %q %q", r.stdout, r.stderr)
	}
	if fi, err := os.Stat(issued); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("issued credentials: %v (%v); want 0600", fi, err)
	}
	fleet, fleetDenied := watchedConn(t, d.natsURL, issued)
	refusedPublish(t, fleet, fleetDenied, "$KV."+events.CheckpointBucket+".cp."+converge.Name+"."+converge.DevInstall+".release")
	fjs, err := jetstream.New(fleet)
	if err != nil {
		t.Fatal(err)
	}
	fkv, err := fjs.KeyValue(context.Background(), events.CheckpointBucket)
	if err != nil {
		t.Fatalf("install-7 binds the bucket: %v", err)
	}
	if _, err := fkv.Put(context.Background(), "rt.converge.install-7", []byte(`{}`)); err != nil {
		t.Fatalf("install-7 writes its own status: %v", err)
	}

	for _, bad := range [][]string{
		{"creds", "issue", "nosuchworker", "x", "--account-seed", filepath.Join(dir, devstack.AuthDir, natsauth.SigningSeedFile)},
		{"creds", "issue", converge.Name, "a.b", "--account-seed", filepath.Join(dir, devstack.AuthDir, natsauth.SigningSeedFile)},
		{"creds", "issue", "publisher"},
	} {
		if r := run(t, nil, bad...); r.code == 0 {
			t.Fatalf("steward %v succeeded", bad)
		}
	}
	if code := d.p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("dev exited %d after SIGTERM", code)
	}
}
