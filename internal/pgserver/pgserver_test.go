//go:build unix

package pgserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/steward-dev/steward/workers/workertest"
)

// testBin is the machine's server binaries, or skips the test.
func testBin(t *testing.T) string {
	t.Helper()
	bin, err := FindBin(os.Getenv("STEWARD_PG_BIN"))
	if err != nil {
		workertest.Requires(t, "PostgreSQL's server binaries", err)
	}
	return bin
}

// testDir is a folder the server's user can reach: t.TempDir's parents
// are 0700 and, when the tests run as root, the postgres user cannot
// enter them.
func testDir(t *testing.T) string {
	t.Helper()
	root, err := TempDir("steward-pgserver-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	return filepath.Join(root, "postgres")
}

func query(t *testing.T, url, sql string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	defer conn.Close(ctx)
	var v string
	if err := conn.QueryRow(ctx, sql).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

func answers(port int) bool {
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
	if err == nil {
		c.Close()
	}
	return err == nil
}

// TestFindBin proves the override wins and must be complete, and that the
// Debian layout's newest complete major version is chosen.
func TestFindBin(t *testing.T) {
	root := t.TempDir()
	mk := func(dir string, names ...string) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if err := os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	all := []string{"initdb", "pg_ctl", "postgres"}
	mk(filepath.Join(root, "9", "bin"), all...)
	mk(filepath.Join(root, "13", "bin"), all...)
	mk(filepath.Join(root, "16", "bin"), "pg_ctl") // client tools only
	if got := newestDebianBin(filepath.Join(root, "*", "bin")); got != filepath.Join(root, "13", "bin") {
		t.Fatalf("newest Debian bin %q, want the 13 one (16 lacks initdb, 9 < 13)", got)
	}
	if got, err := findBin(filepath.Join(root, "9", "bin"), "/nonexistent/*/bin"); err != nil || got != filepath.Join(root, "9", "bin") {
		t.Fatalf("override: %q %v", got, err)
	}
	if _, err := findBin(filepath.Join(root, "16", "bin"), "/nonexistent/*/bin"); err == nil || !strings.Contains(err.Error(), "initdb, postgres") {
		t.Fatalf("incomplete override: %v", err)
	}
	t.Setenv("PATH", t.TempDir())
	if _, err := findBin("", "/nonexistent/*/bin"); !errors.Is(err, ErrNotInstalled) || !strings.Contains(err.Error(), "/nonexistent/*/bin") {
		t.Fatalf("nothing installed: %v", err)
	}
}

// TestCluster runs one cluster through a newcomer's life: made and started
// on 127.0.0.1 with trust for the superuser and passwords for other roles;
// stopped; reused on the next start, same port; a second Start while it
// runs refused; a port another program took replaced and recorded; an
// orphaned server (its Server's process gone) stopped and restarted; a
// stale postmaster.pid whose PID now belongs to another process removed.
func TestCluster(t *testing.T) {
	bin := testBin(t)
	dir := testDir(t)
	ctx := context.Background()
	opts := Options{Bin: bin, Dir: dir, Settings: map[string]string{"fsync": "off"}, Log: t.Logf}

	began := time.Now()
	s, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("made and started in %v: port %d, socket %s, user %s", time.Since(began), s.Port, s.Socket, s.User)
	t.Cleanup(func() { s.Stop() })
	if !s.Initialised || s.Recovered != "" {
		t.Fatalf("a new cluster: Initialised %v, Recovered %q", s.Initialised, s.Recovered)
	}
	if got := query(t, s.URL("postgres"), "SELECT current_setting('listen_addresses') || ' ' || current_setting('port') || ' ' || current_setting('fsync')"); got != "127.0.0.1 "+strconv.Itoa(s.Port)+" off" {
		t.Fatalf("settings %q", got)
	}
	if os.Geteuid() == 0 {
		fi, _ := os.Stat(filepath.Join(dir, "data"))
		if st := fi.Sys().(*syscall.Stat_t); s.User != "postgres" || strconv.Itoa(int(st.Uid)) == "0" {
			t.Fatalf("as root the server runs as %q and data is owned by uid %d", s.User, st.Uid)
		}
	}
	// Other roles need their password on TCP.
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE ROLE someone LOGIN PASSWORD 'right'"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	base := "postgres://someone:%s@127.0.0.1:" + strconv.Itoa(s.Port) + "/postgres?sslmode=disable"
	if c, err := pgx.Connect(ctx, strings.Replace(base, "%s", "wrong", 1)); err == nil {
		c.Close(ctx)
		t.Fatal("a role logged in over TCP with a wrong password")
	}
	if got := query(t, strings.Replace(base, "%s", "right", 1), "SELECT current_user"); got != "someone" {
		t.Fatalf("logged in as %q", got)
	}

	if _, err := Start(ctx, opts); err == nil || !strings.Contains(err.Error(), "another process") {
		t.Fatalf("a second Start while it runs: %v", err)
	}

	port := s.Port
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if answers(port) {
		t.Fatal("the server still answers after Stop")
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "postmaster.pid")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("postmaster.pid after Stop: %v", err)
	}

	// Reused, on the recorded port, with its roles.
	began = time.Now()
	s, err = Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("reused and started in %v", time.Since(began))
	if s.Initialised || s.Port != port || s.Recovered != "" {
		t.Fatalf("second start: Initialised %v, port %d (was %d), Recovered %q", s.Initialised, s.Port, port, s.Recovered)
	}
	if got := query(t, s.URL("postgres"), "SELECT count(*)::text FROM pg_roles WHERE rolname = 'someone'"); got != "1" {
		t.Fatal("the role made before the restart is gone")
	}

	// Orphaned: the Server's holder is gone (its lock released) but the
	// server runs on, as after a SIGKILL of steward dev.
	s.releaseLock()
	s2, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	s = s2
	if !strings.Contains(s.Recovered, "left running") || !answers(s.Port) {
		t.Fatalf("after an orphan: Recovered %q, answers %v", s.Recovered, answers(s.Port))
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}

	// Stale: postmaster.pid names a live process that is no postmaster
	// (this test), as after a reboot reused the PID. PostgreSQL alone
	// would refuse to start.
	pidFile := filepath.Join(dir, "data", "postmaster.pid")
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"+filepath.Join(dir, "data")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// And another program took the recorded port meanwhile.
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s, err = Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(s.Recovered, "stale postmaster.pid") || s.Port == port {
		t.Fatalf("stale pid and busy port: Recovered %q, port %d (busy %d)", s.Recovered, s.Port, port)
	}
	if raw, _ := os.ReadFile(filepath.Join(dir, "port")); strings.TrimSpace(string(raw)) != strconv.Itoa(s.Port) {
		t.Fatalf("port file holds %q, the server runs on %d", raw, s.Port)
	}
	query(t, s.URL("postgres"), "SELECT 'up'")
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	workertest.WaitUntil(t, "the server stops answering", func() bool { return !answers(s.Port) })
}

// TestHalfMade proves a cluster whose initdb was cut short is made again.
func TestHalfMade(t *testing.T) {
	bin := testBin(t)
	dir := testDir(t)
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "data", "PG_VERSION"), []byte("15\n"), 0o600)
	s, err := Start(context.Background(), Options{Bin: bin, Dir: dir, Settings: map[string]string{"fsync": "off"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if !s.Initialised || !strings.Contains(s.Recovered, "initdb had not finished") {
		t.Fatalf("Initialised %v, Recovered %q", s.Initialised, s.Recovered)
	}
}

// TestRootNeedsAPath proves a folder the postgres user cannot reach is
// named before initdb fails on it.
func TestRootNeedsAPath(t *testing.T) {
	if os.Geteuid() != 0 {
		workertest.Requires(t, "root (only root runs the server as another user)", fmt.Errorf("running as uid %d", os.Geteuid()))
	}
	bin := testBin(t)
	closed := t.TempDir() // its parent is 0700
	_, err := Start(context.Background(), Options{Bin: bin, Dir: filepath.Join(closed, "pg")})
	if err == nil || !strings.Contains(err.Error(), "cannot enter") || !strings.Contains(err.Error(), "chmod o+x") {
		t.Fatalf("unreachable folder: %v", err)
	}
}

// TempDir's folder lets the server's user through to a cluster below it,
// which os.MkdirTemp's 0700 does not, and lists nothing to anyone else.
func TestTempDirLetsTheServerThrough(t *testing.T) {
	dir, err := TempDir("steward-pgserver-tempdir-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if mode := fi.Mode().Perm(); mode != 0o711 {
		t.Fatalf("%s is %v, want 0711", dir, mode)
	}
	r, err := serverUser()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.canReach(filepath.Join(dir, "postgres")); err != nil {
		t.Fatal(err)
	}
}
