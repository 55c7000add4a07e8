package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/steward-dev/steward/workers/workertest"
)

// postgres is a private PostgreSQL instance for one test, started from the
// machine's server binaries in a temporary folder on a free port. The
// machine's shared server is never stopped: other packages' tests use it.
type postgres struct {
	port int
	root string
	data string
	p    *proc
}

// pgBin is where PostgreSQL's server binaries live.
func pgBin() string {
	if d := os.Getenv("STEWARD_E2E_PG_BIN"); d != "" {
		return d
	}
	return "/usr/lib/postgresql/15/bin"
}

// pgCredential runs PostgreSQL as the postgres user when the tests run as
// root, since initdb and postgres refuse to run as root.
func pgCredential(t testing.TB) (*syscall.Credential, int, int) {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil, os.Getuid(), os.Getgid()
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Fatalf("running as root, PostgreSQL needs the postgres user: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, uid, gid
}

// startPostgres initialises and starts a private instance with trust
// authentication for the postgres superuser on 127.0.0.1.
func startPostgres(t testing.TB) *postgres {
	t.Helper()
	cred, uid, gid := pgCredential(t)
	// Not t.TempDir: its parents are 0700 root, which postgres cannot enter.
	root, err := os.MkdirTemp("", "steward-e2e-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chown(root, uid, gid); err != nil {
		t.Fatal(err)
	}
	pg := &postgres{port: workertest.FreePort(t), root: root, data: filepath.Join(root, "data")}
	initdb := exec.Command(filepath.Join(pgBin(), "initdb"), "-D", pg.data, "-U", "postgres",
		"-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Env = baseEnv()
	initdb.Dir = root
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	pg.p = newProc(t, "postgres", filepath.Join(pgBin(), "postgres"), []string{
		"-D", pg.data, "-p", strconv.Itoa(pg.port), "-k", root,
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=50",
	}, nil)
	pg.p.cred = cred
	pg.p.dir = root
	pg.start(t)
	return pg
}

// url is the connection URL of the postgres superuser.
func (pg *postgres) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", pg.port, db)
}

// start starts the server and waits until it answers a query.
func (pg *postgres) start(t testing.TB) time.Duration {
	t.Helper()
	pg.p.start()
	return waitFor(t, "PostgreSQL answers", time.Minute, func() (bool, string) {
		if gone, err := pg.p.exited(); gone {
			t.Fatalf("postgres exited: %v\n%s", err, pg.p.tail(20))
		}
		if err := pg.ping(); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
}

// stop shuts the server down the way pg_ctl stop -m fast does (SIGINT).
func (pg *postgres) stop(t testing.TB) {
	t.Helper()
	pg.p.signal(syscall.SIGINT)
	if _, ok := pg.p.wait(30 * time.Second); !ok {
		t.Fatalf("postgres still running 30s after SIGINT")
	}
}

func (pg *postgres) ping() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pg.url("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.Ping(ctx)
}

// query runs a query returning one value per row.
func (pg *postgres) query(t testing.TB, sql string, args ...any) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pg.url("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var v any
		if err := r.Scan(&v); err != nil {
			return "", err
		}
		return fmt.Sprint(v), nil
	})
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return out
}
