//go:build unix

package provision

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/steward-dev/steward/workers/workertest"
)

// TestLoginsFollowTheGrant connects for real, over TCP, as the granted
// role: with the granted password it gets in, with the rotated-away one it
// is refused, after removal it is refused even with the right password,
// and after the re-grant it gets in again. A server that trusts every TCP
// connection proves nothing here, so when the test server does (the
// machine's 5432 uses trust) a private PostgreSQL is started from the
// installed server binaries, with scram-sha-256 on TCP.
func TestLoginsFollowTheGrant(t *testing.T) {
	adminURL, host, port := passwordCheckingServer(t)
	e := newEnvAt(t, adminURL)
	w := e.worker(nil)
	ctx := context.Background()
	login := func(node, password string) error {
		cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=%d sslmode=disable connect_timeout=5", host, port))
		if err != nil {
			t.Fatal(err)
		}
		cfg.User, cfg.Password, cfg.Database = e.role(node), password, e.db(node)
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		var db string
		if err := c.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil || db != e.db(node) {
			t.Fatalf("logged in as %s but current_database() = %q, %v", e.role(node), db, err)
		}
		return nil
	}
	refusedWith := func(step string, err error, code string) {
		t.Helper()
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != code {
			t.Fatalf("%s: login error %v, want SQLSTATE %s", step, err, code)
		}
	}
	const badPassword, notPermitted = "28P01", "28000"

	apply(t, w, e.grant(1, giv{"a", e.db("a"), "first-p4ss"}))
	if err := login("a", "first-p4ss"); err != nil {
		t.Fatalf("created: login with the granted password: %v", err)
	}
	refusedWith("created, wrong password", login("a", "not-the-p4ss"), badPassword)

	apply(t, w, e.grant(2, giv{"a", e.db("a"), "second-p4ss"}))
	refusedWith("rotated, old password", login("a", "first-p4ss"), badPassword)
	if err := login("a", "second-p4ss"); err != nil {
		t.Fatalf("rotated: login with the new password: %v", err)
	}

	apply(t, w, e.grant(3))
	refusedWith("removed, right password", login("a", "second-p4ss"), notPermitted)
	if e.dbOwner(e.db("a")) != e.role("a") {
		t.Fatal("removed: the consumer's database is gone")
	}

	apply(t, w, e.grant(4, giv{"a", e.db("a"), "second-p4ss"}))
	if err := login("a", "second-p4ss"); err != nil {
		t.Fatalf("re-granted: login: %v", err)
	}
}

// passwordCheckingServer returns a superuser connection string and the TCP
// address of a PostgreSQL server that checks passwords on TCP: the test
// server when it does, else a private one.
func passwordCheckingServer(t *testing.T) (adminURL, host string, port uint16) {
	t.Helper()
	cfg, err := pgx.ParseConfig(testURL())
	if err != nil {
		t.Fatal(err)
	}
	if checksPasswords(t, testURL(), "127.0.0.1", cfg.Port) {
		return testURL(), "127.0.0.1", cfg.Port
	}
	t.Logf("%s:%d lets any password in over TCP; starting a private PostgreSQL with scram-sha-256", cfg.Host, cfg.Port)
	return startPrivatePostgres(t)
}

// checksPasswords makes a throwaway login role and tries it over TCP with
// a wrong password.
func checksPasswords(t *testing.T, url, host string, port uint16) bool {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect to the test PostgreSQL: %v", err)
	}
	defer admin.Close(ctx)
	role := "probe_" + randomHex(6)
	v, _ := newVerifier("right-" + randomHex(8))
	lit, _ := verifierLiteral(v)
	if _, err := admin.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN PASSWORD "+lit); err != nil {
		t.Fatal(err)
	}
	defer admin.Exec(ctx, "DROP ROLE "+pgx.Identifier{role}.Sanitize())
	cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=%d dbname=postgres sslmode=disable connect_timeout=5", host, port))
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Password = role, "wrong"
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err == nil {
		c.Close(ctx)
		return false
	}
	return true
}

// startPrivatePostgres runs initdb and postgres from the installed server
// binaries in a temporary folder (as the postgres user when the test runs
// as root, since PostgreSQL refuses to run as root), with trust on its
// Unix socket for the superuser and scram-sha-256 on TCP 127.0.0.1.
func startPrivatePostgres(t *testing.T) (adminURL, host string, port uint16) {
	t.Helper()
	bindir := postgresBinDir(t)
	dir, err := os.MkdirTemp("", "steward-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	attr := &syscall.SysProcAttr{}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root, a private PostgreSQL needs the postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		attr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	command := func(name string, args ...string) *exec.Cmd {
		cmd := exec.Command(filepath.Join(bindir, name), args...)
		cmd.SysProcAttr = attr
		cmd.Dir = dir
		return cmd
	}
	data := filepath.Join(dir, "data")
	if out, err := command("initdb", "-D", data, "-U", "postgres", "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	port = uint16(workertest.FreePort(t))
	logPath := filepath.Join(dir, "server.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	srv := command("postgres", "-D", data, "-p", strconv.Itoa(int(port)), "-k", dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "password_encryption=scram-sha-256")
	srv.Stdout, srv.Stderr = logFile, logFile
	if err := srv.Start(); err != nil {
		t.Fatalf("start postgres: %v", err)
	}
	exited := make(chan struct{})
	go func() { srv.Wait(); close(exited) }()
	t.Cleanup(func() {
		// SIGINT is PostgreSQL's fast shutdown.
		srv.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			srv.Process.Kill()
			<-exited
		}
	})
	adminURL = fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable", dir, port)
	workertest.WaitUntil(t, "the private PostgreSQL accepts connections", func() bool {
		select {
		case <-exited:
			log, _ := os.ReadFile(logPath)
			t.Fatalf("the private PostgreSQL exited:\n%s", log)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			return false
		}
		c.Close(ctx)
		return true
	})
	if !checksPasswords(t, adminURL, "127.0.0.1", port) {
		t.Fatal("the private PostgreSQL lets a wrong password in over TCP")
	}
	return adminURL, "127.0.0.1", port
}

// postgresBinDir finds initdb: beside pg_config's BINDIR, else in the
// newest /usr/lib/postgresql/<version>/bin (Debian, Ubuntu).
func postgresBinDir(t *testing.T) string {
	t.Helper()
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir
		}
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(found) == 0 {
		t.Fatal("the test PostgreSQL trusts every TCP login, and no initdb was found to start one that checks passwords: install the PostgreSQL server binaries, or set STEWARD_TEST_DATABASE_URL to a server using scram-sha-256 on TCP")
	}
	sort.Slice(found, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(found[i]))))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(found[j]))))
		return vi < vj
	})
	return filepath.Dir(found[len(found)-1])
}
