package main

import (
	"bufio"
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
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/internal/atomicfile"
	"github.com/steward-dev/steward/internal/devstack"
	"github.com/steward-dev/steward/internal/natsauth"
	"github.com/steward-dev/steward/internal/pgserver"
	"github.com/steward-dev/steward/workers/credential"
)

// memoryOptions are bench memory's flags.
type memoryOptions struct {
	settle, timeout         time.Duration
	devTarget, workerTarget float64
	dir                     string
	keepDir                 bool
	exe                     string
	progress                func(format string, args ...any)
	natsPort, httpPort      int
}

// devReadyLine is what dev prints last once everything runs.
const devReadyLine = "steward dev is running"

func newBenchMemoryCmd(_ *globals) *cobra.Command {
	var o memoryOptions
	cmd := &cobra.Command{
		Use:   "memory",
		Short: "Measure the resident memory of steward dev and of one worker at rest",
		Long: `Start this binary as ` + "`steward dev`" + ` in a folder of its own (a new temporary
one unless --dir is given) on free ports, wait until it prints that it is
running, wait --settle, and read its resident memory from /proc (VmRSS, and
how much of it is anonymous and how much is file-backed: the binary's own
pages; and its proportional share, PSS, which divides a page that n
processes map among them) and its Go heap from its /metrics. Each process
runs from a copy of this binary of its own, as a worker alone on its host
does: pages of a file several processes map count in each one's RSS, and
stay resident for one while another maps them. It does it twice: the first start,
which makes the keys, the streams and the private PostgreSQL, and a warm start
on the same folder. Then, with the warm dev running, it starts one worker
alone (` + "`steward worker credential`" + ` as dev's credential instance) and measures it
the same way. dev's PostgreSQL is a process of its own and is not counted.
The nats contexts dev writes go to the folder's config/, never the user's.

Figures are in MB of 10^6 bytes, beside the targets (--dev-target,
--worker-target). Linux only: it reads /proc. STEWARD_* and NATS_CONTEXT
are not passed on, so what is measured is the defaults; GODEBUG and OTEL_*
are.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.settle < 0 || o.timeout <= 0 {
				return fmt.Errorf("--settle %v and --timeout %v: want a settle of 0 or more and a timeout above 0", o.settle, o.timeout)
			}
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("bench memory: this binary, to start it as dev and as a worker: %w", err)
			}
			o.exe = exe
			o.progress = func(format string, args ...any) {
				fmt.Fprintf(cmd.ErrOrStderr(), "  "+format+"\n", args...)
			}
			rows, err := runBenchMemory(cmd.Context(), o)
			if err != nil {
				return fmt.Errorf("bench memory: %w", err)
			}
			printMemoryRows(cmd.OutOrStdout(), o, rows)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.DurationVar(&o.settle, "settle", 10*time.Second, "how long each process idles after it is ready before it is measured")
	fs.DurationVar(&o.timeout, "timeout", 3*time.Minute, "give up on a process that is not ready after this long")
	fs.Float64Var(&o.devTarget, "dev-target", 60, "dev's target resident memory after start, in MB")
	fs.Float64Var(&o.workerTarget, "worker-target", 32, "one worker's target resident memory after start, in MB")
	fs.StringVar(&o.dir, "dir", "", "the bench's folder, kept: dev's --dir is its dev/, the processes' logs are beside it (dev-1.log, dev-2.log, worker.log); empty: a new temporary one, removed after. A folder used before makes both starts warm")
	fs.BoolVar(&o.keepDir, "keep-dir", false, "keep the temporary folder, to read the processes' logs")
	return cmd
}

// memoryRow is one measured process.
type memoryRow struct {
	name   string
	target float64
	mem    processMemory
}

// runBenchMemory measures dev's first and warm start, then one worker.
func runBenchMemory(ctx context.Context, o memoryOptions) (rows []memoryRow, err error) {
	dir, cleanup, err := memoryBenchDir(o)
	if err != nil {
		return nil, fmt.Errorf("the bench's folder: %w", err)
	}
	defer cleanup()
	ports, err := freePorts(2)
	if err != nil {
		return nil, fmt.Errorf("free ports: %w", err)
	}
	o.natsPort, o.httpPort = ports[0], ports[1]
	devExe, err := privateCopy(o.exe, filepath.Join(dir, "steward-dev"))
	if err != nil {
		return nil, err
	}
	dev := func(n int) (*benchProcess, error) {
		return startBenchProcess(ctx, devExe, filepath.Join(dir, fmt.Sprintf("dev-%d.log", n)),
			"dev", "--dir", filepath.Join(dir, "dev"),
			"--nats-listen", fmt.Sprintf("127.0.0.1:%d", o.natsPort),
			"--http-listen", fmt.Sprintf("127.0.0.1:%d", o.httpPort))
	}
	devMetrics := fmt.Sprintf("http://127.0.0.1:%d/metrics", o.httpPort)
	starts := []string{"dev, first start", "dev, warm start"}
	if _, err := os.Stat(filepath.Join(dir, "dev")); err == nil {
		starts[0] = "dev, warm start"
	}
	for n, name := range starts {
		p, err := dev(n + 1)
		if err != nil {
			return nil, err
		}
		// The warm dev stays up for the worker; each is stopped before
		// this returns.
		defer p.stop()
		o.progress("%s: waiting for %q", name, devReadyLine)
		if err := p.waitForLine(devReadyLine, o.timeout); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		m, err := p.measure(ctx, o.settle, devMetrics)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		rows = append(rows, memoryRow{name: name, target: o.devTarget, mem: m})
		if n == 0 {
			if err := p.stop(); err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
		}
	}
	w, err := startBenchWorker(ctx, o, dir)
	if err != nil {
		return nil, err
	}
	defer w.stop()
	// The worker binds a port the system picks and logs it: a port picked
	// here beforehand could be taken by the time the worker binds it (CI
	// once failed so, after dev's two starts).
	addr, err := w.waitForLog(workerBound, o.timeout)
	if err != nil {
		return nil, fmt.Errorf("worker credential: %w", err)
	}
	workerHTTP := "http://" + addr
	o.progress("worker credential: waiting for %s/readyz", workerHTTP)
	if err := w.waitReady(ctx, workerHTTP+"/readyz", o.timeout); err != nil {
		return nil, fmt.Errorf("worker credential: %w", err)
	}
	m, err := w.measure(ctx, o.settle, workerHTTP+"/metrics")
	if err != nil {
		return nil, fmt.Errorf("worker credential: %w", err)
	}
	return append(rows, memoryRow{name: "worker credential, alone", target: o.workerTarget, mem: m}), nil
}

// memoryBenchDir is --dir, made if missing, or a new temporary folder that
// cleanup removes unless --keep-dir. Both are 0711: dev's PostgreSQL runs
// as the postgres user when the bench runs as root, and must be let
// through to its cluster below.
func memoryBenchDir(o memoryOptions) (dir string, cleanup func(), err error) {
	if o.dir != "" {
		return o.dir, func() {}, os.MkdirAll(o.dir, 0o711)
	}
	if dir, err = pgserver.TempDir("steward-bench-memory-"); err != nil {
		return "", nil, err
	}
	if o.keepDir {
		return dir, func() { o.progress("kept %s", dir) }, nil
	}
	return dir, func() { os.RemoveAll(dir) }, nil
}

// startBenchWorker starts the credential worker alone as dev's instance
// of it (its credentials, keys and hive), writing to a folder of its own.
func startBenchWorker(ctx context.Context, o memoryOptions, dir string) (*benchProcess, error) {
	devDir := filepath.Join(dir, "dev")
	cfg, _, err := credential.Dev(ctx, devDir)
	if err != nil {
		return nil, err
	}
	id, err := natsauth.Worker(credential.Name, cfg.Hive)
	if err != nil {
		return nil, err
	}
	exe, err := privateCopy(o.exe, filepath.Join(dir, "steward-worker"))
	if err != nil {
		return nil, err
	}
	return startBenchProcess(ctx, exe, filepath.Join(dir, "worker.log"),
		"worker", credential.Name,
		"--nats-url", fmt.Sprintf("nats://127.0.0.1:%d", o.natsPort),
		"--nats-creds", filepath.Join(devDir, devstack.CredsDir, id.Name()+".creds"),
		"--http-addr", "127.0.0.1:0",
		"--hive", cfg.Hive, "--controller-key", cfg.ControllerKey, "--age-identity", cfg.AgeIdentity,
		"--credential-dir", filepath.Join(dir, "worker-files"))
}

// printMemoryRows prints the table, each figure beside its target.
func printMemoryRows(out io.Writer, o memoryOptions, rows []memoryRow) {
	fmt.Fprintf(out, "resident memory %v after ready (MB; dev's PostgreSQL not counted)\n", o.settle)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "process\tresident\tanonymous\tfile-backed\tproportional\tGo heap in use\theap idle, kept\ttarget\t\t")
	for _, r := range rows {
		verdict := "met"
		if over := r.mem.rss - r.target; over > 0 {
			verdict = fmt.Sprintf("missed by %.1f", over)
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%.1f\t%s\t%s\t≤ %.0f\t%s\t\n", r.name, r.mem.rss, r.mem.anon, r.mem.file, r.mem.pss,
			megabytes(r.mem.heapInuse), megabytes(r.mem.heapKept), r.target, verdict)
	}
	tw.Flush()
}

// megabytes prints a /metrics figure, "-" when it was not served.
func megabytes(v float64) string {
	if v < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", v/1e6)
}

// processMemory is what one process holds, in MB; the heap's figures are
// -1 when its /metrics did not serve them.
type processMemory struct {
	rss, anon, file, pss float64
	heapInuse, heapKept  float64
}

// benchProcess is a copy of this binary started as one of the processes
// measured.
type benchProcess struct {
	cmd     *exec.Cmd
	log     string
	lines   chan string
	exited  chan struct{}
	waitErr error
	stopped bool
}

// privateCopy copies this binary to path, for one measured process to run
// alone. A file two processes map is one set of pages counted in each
// one's RSS, and the kernel pages out for one process only what no other
// maps: run from the bench's own file, dev and the worker would hold
// pages only the bench (and the other) touched, which a worker alone on
// its host does not.
func privateCopy(exe, path string) (string, error) {
	raw, err := os.ReadFile(exe)
	if err != nil {
		return "", fmt.Errorf("copy this binary for a process of its own: %w", err)
	}
	// Written whole and synced, as an installed binary is: the kernel
	// pages out only clean pages.
	if err := atomicfile.Write(path, raw, 0o755); err != nil {
		return "", fmt.Errorf("copy this binary to %s: %w", path, err)
	}
	return path, nil
}

// startBenchProcess starts exe with args, its stderr in logPath and its
// stdout read line by line.
func startBenchProcess(ctx context.Context, exe, logPath string, args ...string) (*benchProcess, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.CommandContext(ctx, exe, args...)
	// The figures are of the defaults, and dev writes nats contexts: into
	// the bench's own folder, so the user's steward-dev contexts keep
	// naming the user's dev.
	cmd.Env = isolatedEnv(filepath.Join(filepath.Dir(logPath), "config"))
	cmd.Stderr = logf
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s %s: %w", exe, args[0], err)
	}
	p := &benchProcess{cmd: cmd, log: logPath, lines: make(chan string, 256), exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			default: // nobody waits for a line any more: drop it
			}
		}
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// waitForLine waits until the process prints a line holding want.
func (p *benchProcess) waitForLine(want string, timeout time.Duration) error {
	deadline := time.After(timeout)
	for {
		select {
		case l := <-p.lines:
			if strings.Contains(l, want) {
				return nil
			}
		case <-p.exited:
			return fmt.Errorf("exited (%v) before it printed %q: %s", p.waitErr, want, p.logTail())
		case <-deadline:
			return fmt.Errorf("did not print %q within %v: %s", want, timeout, p.logTail())
		}
	}
}

// workerBound finds, in a worker's JSON log, the address it serves
// /metrics on (runWorker logs it once bound).
var workerBound = regexp.MustCompile(`"addr":"([^"]+)".*"serving /metrics`)

// waitForLog waits until the process's log holds a line re matches, and
// returns the line's first submatch.
func (p *benchProcess) waitForLog(re *regexp.Regexp, timeout time.Duration) (string, error) {
	deadline := time.After(timeout)
	for {
		if raw, err := os.ReadFile(p.log); err == nil {
			if m := re.FindSubmatch(raw); m != nil {
				return string(m[1]), nil
			}
		}
		select {
		case <-p.exited:
			return "", fmt.Errorf("exited (%v) before its log said where it serves: %s", p.waitErr, p.logTail())
		case <-deadline:
			return "", fmt.Errorf("its log did not say where it serves within %v: %s", timeout, p.logTail())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitReady waits until url answers 200.
func (p *benchProcess) waitReady(ctx context.Context, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if _, err := fetchText(ctx, url); err == nil {
			return nil
		} else {
			last = err
		}
		select {
		case <-p.exited:
			return fmt.Errorf("exited (%v) before %s answered: %s", p.waitErr, url, p.logTail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s did not answer 200 within %v (%v): %s", url, timeout, last, p.logTail())
}

// measure idles settle, then reads the process's memory from /proc and
// its heap from metricsURL.
func (p *benchProcess) measure(ctx context.Context, settle time.Duration, metricsURL string) (processMemory, error) {
	select {
	case <-time.After(settle):
	case <-p.exited:
		return processMemory{}, fmt.Errorf("exited (%v) while settling: %s", p.waitErr, p.logTail())
	case <-ctx.Done():
		return processMemory{}, ctx.Err()
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return processMemory{}, fmt.Errorf("its memory: %w (bench memory reads Linux's /proc)", err)
	}
	var m processMemory
	for field, v := range map[string]*float64{"VmRSS": &m.rss, "RssAnon": &m.anon, "RssFile": &m.file} {
		kb, err := procStatusKB(string(status), field)
		if err != nil {
			return processMemory{}, err
		}
		*v = float64(kb) * 1024 / 1e6
	}
	rollup, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", p.cmd.Process.Pid))
	if err != nil {
		return processMemory{}, fmt.Errorf("its memory: %w (bench memory reads Linux's /proc)", err)
	}
	kb, err := procStatusKB(string(rollup), "Pss")
	if err != nil {
		return processMemory{}, err
	}
	m.pss = float64(kb) * 1024 / 1e6
	m.heapInuse, m.heapKept = -1, -1
	if text, err := fetchText(ctx, metricsURL); err == nil {
		inuse, ok1 := metricValue(text, "go_memstats_heap_inuse_bytes")
		idle, ok2 := metricValue(text, "go_memstats_heap_idle_bytes")
		released, ok3 := metricValue(text, "go_memstats_heap_released_bytes")
		if ok1 {
			m.heapInuse = inuse
		}
		if ok2 && ok3 {
			m.heapKept = idle - released
		}
	}
	return m, nil
}

// stop stops the process as a user would, with SIGINT, and waits for it.
func (p *benchProcess) stop() error {
	if p.stopped {
		return nil
	}
	p.stopped = true
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-p.exited:
		return nil
	case <-time.After(time.Minute):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("did not stop within a minute of SIGINT; killed: %s", p.logTail())
	}
}

// logTail is the end of the process's log, for an error.
func (p *benchProcess) logTail() string {
	raw, err := os.ReadFile(p.log)
	if err != nil {
		return "no log: " + err.Error()
	}
	s := strings.TrimSpace(string(raw))
	if len(s) > 2000 {
		s = "..." + s[len(s)-2000:]
	}
	return "its log (" + p.log + "): " + s
}

// isolatedEnv is this process's environment without what would point a
// steward process at another server or change its defaults (STEWARD_*,
// NATS_CONTEXT), with the nats contexts under configHome.
func isolatedEnv(configHome string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envPrefix) && !strings.HasPrefix(kv, "XDG_CONFIG_HOME=") && !strings.HasPrefix(kv, "NATS_CONTEXT=") {
			env = append(env, kv)
		}
	}
	return append(env, "XDG_CONFIG_HOME="+configHome)
}

// procStatusKB reads a "Field:   123 kB" line of /proc/<pid>/status.
func procStatusKB(status, field string) (int64, error) {
	for line := range strings.SplitSeq(status, "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in /proc status", field)
}

// metricValue is the value of an unlabelled metric in Prometheus's text
// format.
func metricValue(text, name string) (float64, bool) {
	for line := range strings.SplitSeq(text, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}

// fetchText GETs url and returns its body when it answers 200.
func fetchText(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", errors.New(resp.Status)
	}
	return string(body), nil
}

// freePorts holds n ports on 127.0.0.1 at once, so none is given twice,
// and lets them go for the processes to take.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
