//go:build unix

// Package pgserver runs a private PostgreSQL cluster from the machine's
// server binaries, in a folder of its own, on a port of its own, listening
// on 127.0.0.1 only. `steward dev` keeps one under --dir so that its
// provision worker never touches the machine's shared server; tests can
// make a fresh one per test.
//
// The folder holds:
//
//	data/        the cluster (initdb's -D), owned by the user the server runs as
//	run/         the Unix socket, when its path fits the kernel's limit
//	server.log   the server's log
//	port         the port, chosen once and kept, so printed lines stay true
//	lock         flocked while a Server runs the cluster
//	initialised  written once initdb and the configuration are complete
//
// initdb, pg_ctl and postgres refuse to run as root, so when the calling
// process is root they run as the postgres system user and the folder is
// owned by it.
package pgserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrNotInstalled is returned by FindBin when no folder holds PostgreSQL's
// server binaries.
var ErrNotInstalled = errors.New("PostgreSQL's server binaries (initdb, pg_ctl, postgres) are not installed")

// Superuser is the cluster's superuser, trusted on the socket and on
// 127.0.0.1.
const Superuser = "postgres"

// serverBinaries are what a bin folder must hold.
var serverBinaries = []string{"initdb", "pg_ctl", "postgres"}

// debianBins is where Debian and Ubuntu install each major version.
const debianBins = "/usr/lib/postgresql/*/bin"

// FindBin returns the folder of PostgreSQL's server binaries: override
// when it is not empty (it must hold them), else what `pg_config --bindir`
// says, else the newest /usr/lib/postgresql/<major>/bin (Debian's layout),
// else the folder of an initdb on PATH. The error wraps ErrNotInstalled
// and says where it looked.
func FindBin(override string) (string, error) {
	return findBin(override, debianBins)
}

func findBin(override, debianGlob string) (string, error) {
	if override != "" {
		if missing := missingBinaries(override); len(missing) > 0 {
			return "", fmt.Errorf("%s holds no %s: it is not a PostgreSQL server bin folder (pg_config --bindir names one)", override, strings.Join(missing, ", "))
		}
		return override, nil
	}
	looked := []string{}
	// pg_config may come with the client library alone (libpq-dev), so its
	// answer counts only when the server binaries are there.
	if pgConfig, err := exec.LookPath("pg_config"); err == nil {
		out, err := exec.Command(pgConfig, "--bindir").Output()
		if dir := strings.TrimSpace(string(out)); err == nil && dir != "" {
			if len(missingBinaries(dir)) == 0 {
				return dir, nil
			}
			looked = append(looked, dir+" (pg_config --bindir)")
		}
	} else {
		looked = append(looked, "pg_config (not on PATH)")
	}
	if dir := newestDebianBin(debianGlob); dir != "" {
		return dir, nil
	}
	looked = append(looked, debianGlob)
	if initdb, err := exec.LookPath("initdb"); err == nil {
		if dir := filepath.Dir(initdb); len(missingBinaries(dir)) == 0 {
			return dir, nil
		}
	}
	looked = append(looked, "initdb on PATH")
	return "", fmt.Errorf("%w (looked in %s)", ErrNotInstalled, strings.Join(looked, ", "))
}

// newestDebianBin is the complete bin folder of the highest major version
// matching glob, or "".
func newestDebianBin(glob string) string {
	dirs, _ := filepath.Glob(glob)
	best, bestVersion := "", -1
	for _, d := range dirs {
		v, err := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		if err != nil || v <= bestVersion || len(missingBinaries(d)) > 0 {
			continue
		}
		best, bestVersion = d, v
	}
	return best
}

func missingBinaries(dir string) []string {
	var missing []string
	for _, b := range serverBinaries {
		fi, err := os.Stat(filepath.Join(dir, b))
		if err != nil || fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
			missing = append(missing, b)
		}
	}
	return missing
}

// Options say which cluster to run and how.
type Options struct {
	// Bin is the folder of the server binaries, as FindBin returns it.
	Bin string
	// Dir is the cluster's folder; it is made when absent. Its parents
	// must let the server's user through (when root, the postgres user).
	Dir string
	// Settings are postgresql.conf settings added to the defaults (for
	// tests: "fsync": "off"). They are rewritten at every start.
	Settings map[string]string
	// Log, when set, receives a line for each step Start takes (initdb,
	// recovery, start), for a person waiting on it.
	Log func(format string, args ...any)
}

// Server is a cluster started by Start, until Stop.
type Server struct {
	// Dir is the cluster's folder.
	Dir string
	// Bin is the folder of the binaries it runs.
	Bin string
	// Port is the TCP port on 127.0.0.1.
	Port int
	// Socket is the Unix socket folder, or "" when --dir's path is too
	// long for one and the server listens on TCP only.
	Socket string
	// LogFile is the server's log.
	LogFile string
	// User is the system user the server runs as.
	User string
	// Initialised says this Start made the cluster (ran initdb); false
	// means an existing one was reused.
	Initialised bool
	// Recovered says what Start found left behind by a process that did
	// not stop it (a stale postmaster.pid, an orphaned server, a
	// half-made cluster) and cleared, or "".
	Recovered string

	run      runAs
	lock     *os.File
	stopOnce sync.Once
	stopErr  error
}

// runAs is who the server's programs run as.
type runAs struct {
	name     string
	uid, gid int
	cred     *syscall.Credential // nil: as this process
}

// maxSocketPath is the longest Unix socket path Linux takes (sun_path is
// 108 bytes with the terminating NUL); a longer one stops the server.
const maxSocketPath = 107

// shellUnsafe are the characters pg_ctl's /bin/sh command line would not
// survive inside its double quotes.
var shellUnsafe = regexp.MustCompile("[\"$`\\\\\n]")

// versionPattern finds the version in `postgres --version` ("postgres
// (PostgreSQL) 15.8 (Debian 15.8-0+deb12u1)"): its first number is the major.
var versionPattern = regexp.MustCompile(`(\d+)(\.\d+)*`)

// Start runs the cluster in opts.Dir: it initialises it when it is new,
// clears what a killed predecessor left (a stale postmaster.pid, a server
// still running with no one to stop it), keeps the recorded port unless
// another program took it, and starts the server with pg_ctl, waiting
// until it accepts connections. One Server runs a folder's cluster at a
// time; a second Start on it while the first runs is an error.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if opts.Bin == "" || opts.Dir == "" {
		return nil, errors.New("pgserver: Options.Bin and Options.Dir are required")
	}
	logf := opts.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	if shellUnsafe.MatchString(dir) {
		return nil, fmt.Errorf("the PostgreSQL folder %q holds a character pg_ctl's shell command cannot quote (\", $, `, \\ or a newline); use a folder without them", dir)
	}
	who, err := serverUser()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("make the PostgreSQL folder: %w", err)
	}
	if err := who.own(dir); err != nil {
		return nil, err
	}
	if err := who.canReach(dir); err != nil {
		return nil, err
	}
	s := &Server{Dir: dir, Bin: opts.Bin, LogFile: filepath.Join(dir, "server.log"), User: who.name, run: who}
	if err := s.takeLock(); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			s.releaseLock()
		}
	}()
	if err := s.ensureInitialised(ctx, logf); err != nil {
		return nil, err
	}
	if err := s.clearLeftovers(logf); err != nil {
		return nil, err
	}
	if err := s.choosePort(); err != nil {
		return nil, err
	}
	if err := s.configure(opts.Settings); err != nil {
		return nil, err
	}
	logf("starting PostgreSQL on 127.0.0.1:%d (data %s)", s.Port, s.data())
	if out, err := s.pgctl("start", "-l", s.LogFile, "-w", "-t", "60", "-s"); err != nil {
		return nil, fmt.Errorf("pg_ctl start of the cluster in %s failed: %w\n%s\nserver log %s ends:\n%s", s.data(), err, out, s.LogFile, tail(s.LogFile, 15))
	}
	ok = true
	return s, nil
}

// URL is a pgx/libpq connection URL for the superuser to database.
func (s *Server) URL(database string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", Superuser, s.Port, database)
}

// Stop shuts the server down with pg_ctl stop -m fast (open sessions are
// ended, the cluster is left consistent) and releases the folder. Calling
// it again returns the first call's result.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		if out, err := s.pgctl("stop", "-m", "fast", "-w", "-t", "60", "-s"); err != nil {
			s.stopErr = fmt.Errorf("pg_ctl stop of the cluster in %s failed: %w\n%s(the next start stops a server left running)", s.data(), err, out)
		}
		s.releaseLock()
	})
	return s.stopErr
}

func (s *Server) data() string { return filepath.Join(s.Dir, "data") }

// serverUser is this process's user, or the postgres system user when this
// process is root, since initdb, pg_ctl and postgres refuse root.
func serverUser() (runAs, error) {
	if os.Geteuid() != 0 {
		name := strconv.Itoa(os.Getuid())
		if u, err := user.Current(); err == nil {
			name = u.Username
		}
		return runAs{name: name, uid: os.Getuid(), gid: os.Getgid()}, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return runAs{}, fmt.Errorf("running as root, and PostgreSQL refuses root, but there is no postgres system user to run it as (%v); create one (the postgresql package does) or run as another user", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return runAs{name: "postgres", uid: uid, gid: gid, cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}, nil
}

// own gives path to the server's user when that is not this process's.
func (r runAs) own(path string) error {
	if r.cred == nil {
		return nil
	}
	if err := os.Lchown(path, r.uid, r.gid); err != nil {
		return fmt.Errorf("give %s to the %s user: %w", path, r.name, err)
	}
	return nil
}

// canReach checks every folder above dir lets the server's user through,
// so a blocked path is named here rather than as initdb's "Permission
// denied". Supplementary groups are not counted: the server runs with
// its primary group only.
func (r runAs) canReach(dir string) error {
	if r.cred == nil {
		return nil
	}
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		mode := fi.Mode().Perm()
		through := mode&0o001 != 0 ||
			(st != nil && int(st.Uid) == r.uid && mode&0o100 != 0) ||
			(st != nil && int(st.Gid) == r.gid && mode&0o010 != 0)
		if !through {
			return fmt.Errorf("PostgreSQL runs as the %s user, which cannot enter %s (mode %v) on the way to %s; give that folder o+x (chmod o+x %s) or use a folder it can reach", r.name, p, mode, dir, p)
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

// command runs a server program as the server's user, in dir, with no
// libpq or PGDATA variables from this process's environment (PGPORT or
// PGDATA there would point pg_ctl at another cluster).
func (r runAs) command(dir, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	// Its own process group: a Ctrl-C at the terminal reaches only the
	// caller, which then stops the server in its turn, after its users.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: r.cred, Setpgid: true}
	return cmd
}

func (s *Server) pgctl(action string, args ...string) ([]byte, error) {
	args = append([]string{action, "-D", s.data()}, args...)
	return s.run.command(s.Dir, filepath.Join(s.Bin, "pg_ctl"), args...).CombinedOutput()
}

// takeLock flocks Dir/lock. The kernel drops it when the holder dies,
// however it dies, so a held lock means a live process runs the cluster.
func (s *Server) takeLock() error {
	f, err := os.OpenFile(filepath.Join(s.Dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open the PostgreSQL folder's lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("another process (a steward dev on the same --dir?) runs the PostgreSQL cluster in %s; stop it or use another folder", s.Dir)
		}
		return fmt.Errorf("lock the PostgreSQL folder %s: %w", s.Dir, err)
	}
	s.lock = f
	return nil
}

func (s *Server) releaseLock() {
	if s.lock != nil {
		syscall.Flock(int(s.lock.Fd()), syscall.LOCK_UN)
		s.lock.Close()
		s.lock = nil
	}
}

// ensureInitialised runs initdb when the cluster is new. A data folder
// without the initialised marker is a cluster whose making was cut short
// (the process was killed during initdb), never one with data in it, so
// it is made again.
func (s *Server) ensureInitialised(ctx context.Context, logf func(string, ...any)) error {
	marker := filepath.Join(s.Dir, "initialised")
	if _, err := os.Stat(marker); err == nil {
		return s.checkVersion()
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if _, err := os.Stat(s.data()); err == nil {
		logf("removing %s: its initdb did not finish", s.data())
		if err := os.RemoveAll(s.data()); err != nil {
			return fmt.Errorf("remove the half-made cluster %s: %w", s.data(), err)
		}
		s.Recovered = "made again the cluster whose initdb had not finished"
	}
	logf("initialising a PostgreSQL cluster in %s (initdb, as the %s user)", s.data(), s.run.name)
	cmd := s.run.command(s.Dir, filepath.Join(s.Bin, "initdb"), "-D", s.data(), "-U", Superuser,
		"-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run initdb from %s: %w", s.Bin, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("initdb in %s failed: %w\n%s", s.data(), err, out.String())
		}
	case <-ctx.Done():
		// The group, not only initdb: it runs postgres in bootstrap mode.
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return fmt.Errorf("initdb in %s interrupted: %w (the next start makes it again)", s.data(), ctx.Err())
	}
	// Trust only where no password could be asked of a person anyway:
	// the socket (its folder is the server user's, 0700) and the
	// superuser from 127.0.0.1. Other roles log in with their passwords,
	// as the roles Steward provisions would on a real server.
	hba := "# Written by Steward (internal/pgserver): a private development cluster.\n" +
		"local all all trust\n" +
		"host all " + Superuser + " 127.0.0.1/32 trust\n" +
		"host all all 127.0.0.1/32 scram-sha-256\n"
	if err := s.writeOwned(filepath.Join(s.data(), "pg_hba.conf"), hba); err != nil {
		return err
	}
	conf, err := os.OpenFile(filepath.Join(s.data(), "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = conf.WriteString("\n# Steward's settings for this cluster, rewritten at every start.\ninclude_if_exists = 'steward.conf'\n")
	if cerr := conf.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("configure the cluster in %s: %w", s.data(), err)
	}
	if err := os.WriteFile(marker, []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o600); err != nil {
		return err
	}
	s.Initialised = true
	return nil
}

// checkVersion refuses a cluster the binaries cannot run, naming both
// versions, instead of leaving it to the server log.
func (s *Server) checkVersion() error {
	raw, err := os.ReadFile(filepath.Join(s.data(), "PG_VERSION"))
	if err != nil {
		return fmt.Errorf("the cluster in %s has no readable PG_VERSION (%v); move %s away to have a new one made", s.data(), err, s.Dir)
	}
	made := strings.TrimSpace(string(raw))
	out, err := exec.Command(filepath.Join(s.Bin, "postgres"), "--version").Output()
	if err != nil {
		return fmt.Errorf("%s/postgres --version: %w", s.Bin, err)
	}
	m := versionPattern.FindStringSubmatch(string(out))
	if m == nil {
		return nil
	}
	if have := m[1]; have != made && !strings.HasPrefix(made, have+".") {
		return fmt.Errorf("the cluster in %s was made by PostgreSQL %s and %s holds PostgreSQL %s; point at %s binaries, or move %s away to have a new cluster made (its roles and databases go with it)", s.data(), made, s.Bin, have, made, s.Dir)
	}
	return nil
}

// clearLeftovers deals with a postmaster.pid the previous holder of the
// folder left. The lock is ours, so no live Server runs the cluster: a
// postmaster still running in the data folder was orphaned by a process
// that was killed, and is stopped; a pid file naming no such postmaster
// is stale and removed, since PostgreSQL would refuse to start if its PID
// now belongs to another process.
func (s *Server) clearLeftovers(logf func(string, ...any)) error {
	pidFile := filepath.Join(s.data(), "postmaster.pid")
	raw, err := os.ReadFile(pidFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(raw), "\n", 2)[0]))
	if pid > 0 && s.isOurPostmaster(pid) {
		logf("stopping the PostgreSQL (pid %d) left running in %s by a process that did not stop it", pid, s.data())
		if out, err := s.pgctl("stop", "-m", "fast", "-w", "-t", "60", "-s"); err != nil {
			return fmt.Errorf("PostgreSQL (pid %d) still runs in %s with no one to stop it, and pg_ctl stop failed: %w\n%s; stop it (kill -INT %d) and start again", pid, s.data(), err, out, pid)
		}
		s.note(fmt.Sprintf("stopped the server (pid %d) a killed predecessor left running", pid))
		return nil
	}
	logf("removing the stale %s (pid %d is not a postmaster of this cluster)", pidFile, pid)
	if err := os.Remove(pidFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the stale %s: %w", pidFile, err)
	}
	// The socket's lock files carry the same PID check.
	locks, _ := filepath.Glob(filepath.Join(s.Dir, "run", ".s.PGSQL.*"))
	for _, l := range locks {
		os.Remove(l)
	}
	s.note(fmt.Sprintf("removed a stale postmaster.pid (pid %d)", pid))
	return nil
}

func (s *Server) note(what string) {
	if s.Recovered != "" {
		s.Recovered += "; "
	}
	s.Recovered += what
}

// isOurPostmaster says pid is a postgres process whose working folder is
// this cluster's data folder: the postmaster changes into its data folder,
// so that tells it from an unrelated process that reused the PID.
func (s *Server) isOurPostmaster(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil || !strings.HasPrefix(filepath.Base(exe), "postgres") {
		return false
	}
	cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	if err != nil {
		return false
	}
	want, err := filepath.EvalSymlinks(s.data())
	return err == nil && cwd == want
}

// choosePort keeps the port recorded in Dir/port while it is free, and
// otherwise takes a free one and records it.
func (s *Server) choosePort() error {
	path := filepath.Join(s.Dir, "port")
	if raw, err := os.ReadFile(path); err == nil {
		if p, err := strconv.Atoi(strings.TrimSpace(string(raw))); err == nil && p > 0 && p < 65536 && portFree(p) {
			s.Port = p
			return nil
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("find a free port for PostgreSQL: %w", err)
	}
	s.Port = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return os.WriteFile(path, []byte(strconv.Itoa(s.Port)+"\n"), 0o644)
}

func portFree(port int) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// configure writes data/steward.conf, which postgresql.conf includes:
// 127.0.0.1 only, the chosen port, the socket under Dir when its path
// fits, and the caller's settings.
func (s *Server) configure(extra map[string]string) error {
	settings := map[string]string{
		"listen_addresses":        "127.0.0.1",
		"port":                    strconv.Itoa(s.Port),
		"unix_socket_directories": "",
		// Dev's data is re-made from its events; a commit need not wait
		// for the disk (unlike fsync=off, a crash loses commits, never
		// the cluster).
		"synchronous_commit": "off",
	}
	run := filepath.Join(s.Dir, "run")
	if len(filepath.Join(run, ".s.PGSQL."+strconv.Itoa(s.Port))) <= maxSocketPath {
		if err := os.MkdirAll(run, 0o700); err != nil {
			return err
		}
		if err := s.run.own(run); err != nil {
			return err
		}
		settings["unix_socket_directories"] = run
		s.Socket = run
	}
	for k, v := range extra {
		settings[k] = v
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteString("# Written by Steward (internal/pgserver) at every start; edits are lost.\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "%s = '%s'\n", k, strings.ReplaceAll(settings[k], "'", "''"))
	}
	return s.writeOwned(filepath.Join(s.data(), "steward.conf"), b.String())
}

// writeOwned writes a file the server reads, 0600, owned by its user.
func (s *Server) writeOwned(path, text string) error {
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return s.run.own(path)
}

// tail is the last n lines of a file, for an error a person reads.
func tail(path string, n int) string {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
