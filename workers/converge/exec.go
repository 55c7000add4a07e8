package converge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// execRunner runs a local command as the ops job, for development and
// compose. The command gets the release in its environment; its exit
// status is the result.
//
// Its "execution" is a process of this worker, so the checkpointed name is
// best-effort: a redelivery in the same process watches the same command,
// but after a crash the command died with the worker (or runs on orphaned)
// and nothing can tell whether it applied the release. The worker then
// reports the converge as failed rather than running the command a second
// time, the installed version stays, and an operator checks the install
// and publishes the release again if it is to be retried.
type execRunner struct {
	cfg *checked

	mu    sync.Mutex
	procs map[string]*proc
}

type proc struct {
	done chan struct{}
	res  result
}

func newExec(cfg *checked) *execRunner {
	return &execRunner{cfg: cfg, procs: map[string]*proc{}}
}

func (e *execRunner) close() error { return nil }

// ensure has nothing to prepare: the command is the job.
func (e *execRunner) ensure(context.Context, release) (string, error) { return "", nil }

// execEnv is the worker's environment without its own STEWARD_* settings
// (they are the worker's, not the job's), plus the release.
func execEnv(rel release) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "STEWARD_") {
			env = append(env, kv)
		}
	}
	return append(env,
		"STEWARD_INSTALL="+rel.Install,
		"STEWARD_IMAGE="+rel.Image,
		"STEWARD_TARGET_VERSION="+rel.Version,
		"STEWARD_FROM_VERSION="+rel.From,
	)
}

func (e *execRunner) start(ctx context.Context, rel release, _ string) (string, error) {
	// The command lives as long as the handler (which outlives a shutdown
	// by the grace period) and never longer than the task timeout.
	pctx, cancel := context.WithTimeout(ctx, e.cfg.TaskTimeout)
	cmd := exec.CommandContext(pctx, "sh", "-c", e.cfg.ExecCommand)
	cmd.Env = execEnv(rel)
	out := &lineLog{log: *rel.log()}
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group, so a timeout ends the whole command, not
	// only the shell.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		return "", &runnerRefusal{err: fmt.Errorf("exec command could not start: %w", err)}
	}
	name := "exec-" + strconv.Itoa(cmd.Process.Pid) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	p := &proc{done: make(chan struct{})}
	e.mu.Lock()
	e.procs[name] = p
	e.mu.Unlock()
	go func() {
		defer close(p.done)
		defer cancel()
		err := cmd.Wait()
		out.flush()
		var exitErr *exec.ExitError
		switch {
		case err == nil:
			p.res = result{Succeeded: true}
		case errors.Is(pctx.Err(), context.DeadlineExceeded):
			p.res = result{Condition: "the command was killed after the task timeout of " + e.cfg.TaskTimeout.String()}
		case errors.As(err, &exitErr):
			p.res = result{Condition: "the command ended with " + exitErr.ProcessState.String()}
		default:
			p.res = result{Condition: "the command failed: " + err.Error()}
		}
	}()
	rel.log().Info().Str("execution", name).Msg("exec command started")
	return name, nil
}

func (e *execRunner) watch(ctx context.Context, _ release, execution string) (result, error) {
	e.mu.Lock()
	p, ok := e.procs[execution]
	e.mu.Unlock()
	if !ok {
		return result{Condition: "the worker stopped while command " + execution + " ran, so whether it applied the release is unknown; it was not run a second time"}, nil
	}
	select {
	case <-p.done:
		e.mu.Lock()
		delete(e.procs, execution)
		e.mu.Unlock()
		return p.res, nil
	case <-ctx.Done():
		return result{}, ctx.Err()
	}
}

// lineLog logs a command's output line by line. exec calls Write from one
// goroutine at a time because Stdout and Stderr are the same writer.
type lineLog struct {
	log zerolog.Logger
	buf []byte
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		l.log.Info().Str("exec_output", string(l.buf[:i])).Msg("exec command output")
		l.buf = l.buf[i+1:]
	}
	if len(l.buf) > 4096 {
		l.flush()
	}
	return len(p), nil
}

func (l *lineLog) flush() {
	if len(l.buf) > 0 {
		l.log.Info().Str("exec_output", string(l.buf)).Msg("exec command output")
		l.buf = nil
	}
}
