package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/steward-dev/steward/workers/workertest"
)

// bin is the steward binary the tests run as real processes; configHome
// is their XDG_CONFIG_HOME.
var bin, configHome string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "steward-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "steward")
	// The nats CLI's contexts the processes read and steward dev writes
	// live here, never in the developer's own ~/.config/nats.
	configHome = filepath.Join(dir, "config")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// cleanEnv is this process's environment without STEWARD_* variables, so
// a developer's shell does not leak into the tests, plus extra.
func cleanEnv(extra ...string) []string {
	return append(isolatedEnv(configHome), extra...)
}

type result struct {
	stdout, stderr string
	code           int
}

// run runs steward to completion with extra environment variables.
func run(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = cleanEnv(env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("steward %s: %v", strings.Join(args, " "), err)
		}
		r.code = ee.ExitCode()
	}
	return r
}

// ok runs steward and fails the test unless it exits 0.
func ok(t *testing.T, env []string, args ...string) result {
	t.Helper()
	r := run(t, env, args...)
	if r.code != 0 {
		t.Fatalf("steward %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r
}

// proc is a long-running steward process whose stdout is read line by line.
type proc struct {
	cmd    *exec.Cmd
	mu     sync.Mutex // guards lines
	lines  []string
	stderr workertest.Logs
	done   chan struct{}
	err    error
}

func start(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Env = cleanEnv(env...)
	p.cmd.Stderr = &p.stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
		}
		io.Copy(io.Discard, out)
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("steward %s stdout:\n%s\nstderr:\n%s", strings.Join(args, " "), p.output(), p.errors())
		}
	})
	return p
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

func (p *proc) errors() string { return p.stderr.String() }

func (p *proc) snapshot() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

// waitLine waits until a line of stdout contains s and returns it.
func (p *proc) waitLine(t *testing.T, s string) string {
	t.Helper()
	var found string
	workertest.WaitUntil(t, fmt.Sprintf("stdout has a line with %q", s), func() bool {
		for _, l := range p.snapshot() {
			if strings.Contains(l, s) {
				found = l
				return true
			}
		}
		select {
		case <-p.done:
			t.Fatalf("steward exited (%v) before printing %q", p.err, s)
		default:
		}
		return false
	})
	return found
}

// stop sends sig and waits for the process to exit, returning its code.
func (p *proc) stop(t *testing.T, sig syscall.Signal) int {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(workertest.DefaultTimeout):
		t.Fatalf("steward did not stop within %v of %v", workertest.DefaultTimeout, sig)
	}
	return p.cmd.ProcessState.ExitCode()
}
