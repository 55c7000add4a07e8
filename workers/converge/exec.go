package converge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/internal/atomicfile"
)

// execRunner runs a local command as the ops job, for development and
// compose. The command gets the release in its environment; its exit
// status is the result.
//
// Its rule, since it has no Cloud Run to ask: with --exec-record-dir it
// writes a record of every execution there (its event, version, image and,
// once it ended, its result), before the command starts and again when it
// ends, and answers from those records exactly as the cloudrun runner
// answers from Cloud Run: a stage's execution is believed only as its
// record says, a redelivery whose stage is gone finds its event's record
// instead of running the command again, and a removed or forged
// installed-version document is rebuilt from the newest succeeded record.
// The records are on the worker's own disk, out of reach of whoever can
// write the checkpoint bucket.
//
// Without --exec-record-dir it knows only the commands of its own process.
// An execution a stage names that this process did not start (after a
// crash, or forged) is then reported as failed with its outcome unknown,
// never believed to have succeeded and never run a second time; an
// installed-version document that does not verify holds the worker and
// names the re-seed; and a missing one reads as a first start
// (--installed-version), which is why anything but a development box sets
// the directory.
type execRunner struct {
	cfg *checked

	mu    sync.Mutex
	procs map[string]*proc
}

type proc struct {
	done chan struct{}
	x    execution
}

// execRecord is one execution as the exec runner records it.
type execRecord struct {
	Name      string    `json:"name"`
	Install   string    `json:"install"`
	EventID   string    `json:"eventId"`
	Version   string    `json:"version"`
	Image     string    `json:"image"`
	Created   time.Time `json:"created"`
	Done      bool      `json:"done"`
	Succeeded bool      `json:"succeeded"`
	Condition string    `json:"condition,omitempty"`
}

func (r execRecord) execution() execution {
	return execution{Name: r.Name, Image: r.Image, EventID: r.EventID, Version: r.Version, Created: r.Created, Done: r.Done, Result: result{Succeeded: r.Succeeded, Condition: r.Condition}}
}

// execName is the form of the exec runner's execution names; nothing else
// is ever turned into a record's path.
var execName = regexp.MustCompile(`^exec-[0-9]+-[0-9a-z]+$`)

func newExec(cfg *checked) *execRunner {
	return &execRunner{cfg: cfg, procs: map[string]*proc{}}
}

func (e *execRunner) close() error { return nil }

// ensure has nothing to prepare: the command is the job.
func (e *execRunner) ensure(context.Context, release) error { return nil }

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

func (e *execRunner) recordPath(name string) string {
	return filepath.Join(e.cfg.ExecRecordDir, name+".json")
}

// writeRecord writes rec durably when there is a record directory.
func (e *execRunner) writeRecord(rec execRecord) error {
	if e.cfg.ExecRecordDir == "" {
		return nil
	}
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(e.recordPath(rec.Name), raw, 0o600); err != nil {
		return fmt.Errorf("record exec execution %s of event %s in --exec-record-dir %s: %w", rec.Name, rec.EventID, e.cfg.ExecRecordDir, err)
	}
	return nil
}

// records reads every record of this install, newest first. A record that
// cannot be read is an error, never skipped: skipping it could hide the
// newest execution.
func (e *execRunner) records() ([]execRecord, error) {
	entries, err := os.ReadDir(e.cfg.ExecRecordDir)
	if err != nil {
		return nil, fmt.Errorf("read --exec-record-dir %s: %w", e.cfg.ExecRecordDir, err)
	}
	var out []execRecord
	for _, ent := range entries {
		name, ok := strings.CutSuffix(ent.Name(), ".json")
		if !ok || !execName.MatchString(name) {
			continue
		}
		rec, err := e.readRecord(name)
		if err != nil {
			return nil, err
		}
		if rec.Install == e.cfg.Install {
			out = append(out, rec)
		}
	}
	slices.SortStableFunc(out, func(a, b execRecord) int { return b.Created.Compare(a.Created) })
	return out, nil
}

func (e *execRunner) readRecord(name string) (execRecord, error) {
	var rec execRecord
	raw, err := os.ReadFile(e.recordPath(name))
	if err != nil {
		return rec, fmt.Errorf("read exec record %s: %w", e.recordPath(name), err)
	}
	if err := json.Unmarshal(raw, &rec); err != nil || rec.Name != name {
		return rec, fmt.Errorf("exec record %s is not a record of execution %s (%v); move it out of --exec-record-dir if it is not the runner's", e.recordPath(name), name, err)
	}
	return rec, nil
}

func (e *execRunner) start(ctx context.Context, rel release) (string, error) {
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
	now := time.Now()
	name := "exec-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(now.UnixNano(), 36)
	rec := execRecord{Name: name, Install: rel.Install, EventID: rel.EventID, Version: rel.Version, Image: rel.Image, Created: now.UTC()}
	// Recorded before it starts: a crash while it runs leaves a record
	// without a result, which reads as "unknown, not run again" rather
	// than as no execution at all.
	if err := e.writeRecord(rec); err != nil {
		cancel()
		return "", err
	}
	if err := cmd.Start(); err != nil {
		cancel()
		if e.cfg.ExecRecordDir != "" {
			_ = os.Remove(e.recordPath(name))
		}
		return "", &runnerRefusal{err: fmt.Errorf("exec command could not start: %w", err)}
	}
	p := &proc{done: make(chan struct{}), x: rec.execution()}
	e.mu.Lock()
	e.procs[name] = p
	e.mu.Unlock()
	go func() {
		defer close(p.done)
		defer cancel()
		err := cmd.Wait()
		out.flush()
		var exitErr *exec.ExitError
		var res result
		switch {
		case err == nil:
			res = result{Succeeded: true}
		case errors.Is(pctx.Err(), context.DeadlineExceeded):
			res = result{Condition: "the command was killed after the task timeout of " + e.cfg.TaskTimeout.String()}
		case errors.As(err, &exitErr):
			res = result{Condition: "the command ended with " + exitErr.ProcessState.String()}
		default:
			res = result{Condition: "the command failed: " + err.Error()}
		}
		rec.Done, rec.Succeeded, rec.Condition = true, res.Succeeded, res.Condition
		if err := e.writeRecord(rec); err != nil {
			// Not recorded, not believed: a later reader finds the
			// record without a result, which is "unknown".
			rel.log().Error().Err(err).Str("execution", name).Msg("the exec runner could not record how its command ended")
			res = result{Condition: fmt.Sprintf("%s; %v, so it is not believed", describe(res), err)}
		}
		e.mu.Lock()
		p.x.Done, p.x.Result = true, res
		e.mu.Unlock()
	}()
	rel.log().Info().Str("execution", name).Msg("exec command started")
	return name, nil
}

func describe(r result) string {
	if r.Succeeded {
		return "the command succeeded"
	}
	return r.Condition
}

// unknown is how an execution ended that the runner cannot account for.
func unknown(name string) result {
	return result{Condition: "the worker stopped while command " + name + " ran, so whether it applied the release is unknown; it was not run a second time"}
}

// find looks in this process's commands, then in the records.
func (e *execRunner) find(_ context.Context, rel release) (execution, bool, error) {
	e.mu.Lock()
	for _, p := range e.procs {
		if p.x.forEvent(rel.EventID) {
			x := p.x
			e.mu.Unlock()
			return x, true, nil
		}
	}
	e.mu.Unlock()
	if e.cfg.ExecRecordDir == "" {
		return execution{}, false, nil
	}
	recs, err := e.records()
	if err != nil {
		return execution{}, false, err
	}
	for _, r := range recs {
		if r.execution().forEvent(rel.EventID) {
			return e.settled(r), true, nil
		}
	}
	return execution{}, false, nil
}

// settled is a record as it stands once no command of this process is
// running it: a record without a result is a command that died with an
// earlier worker.
func (e *execRunner) settled(r execRecord) execution {
	x := r.execution()
	if !x.Done {
		x.Done, x.Result = true, unknown(r.Name)
	}
	return x
}

func (e *execRunner) lookup(_ context.Context, rel release, name string) (execution, bool, error) {
	e.mu.Lock()
	p, ok := e.procs[name]
	var x execution
	if ok {
		x = p.x
	}
	e.mu.Unlock()
	if ok {
		return x, true, nil
	}
	if e.cfg.ExecRecordDir == "" {
		// No record to check the claim against: believed only as far as
		// "it ran for this release and its outcome is unknown", which
		// moves nothing and runs nothing again.
		return execution{Name: name, Image: rel.Image, EventID: rel.EventID, Version: rel.Version, Done: true, Result: unknown(name)}, true, nil
	}
	if !execName.MatchString(name) {
		return execution{}, false, nil
	}
	r, err := e.readRecord(name)
	if errors.Is(err, fs.ErrNotExist) {
		return execution{}, false, nil
	}
	if err != nil {
		return execution{}, false, err
	}
	if r.Install != e.cfg.Install {
		return execution{}, false, nil
	}
	return e.settled(r), true, nil
}

func (e *execRunner) history(context.Context) ([]execution, bool, error) {
	if e.cfg.ExecRecordDir == "" {
		return nil, false, nil
	}
	recs, err := e.records()
	if err != nil {
		return nil, true, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]execution, 0, len(recs))
	for _, r := range recs {
		if p, ok := e.procs[r.Name]; ok {
			out = append(out, p.x)
			continue
		}
		out = append(out, e.settled(r))
	}
	return out, true, nil
}

func (e *execRunner) watch(ctx context.Context, rel release, execution string) (result, error) {
	e.mu.Lock()
	p, ok := e.procs[execution]
	e.mu.Unlock()
	if !ok {
		x, found, err := e.lookup(ctx, rel, execution)
		if err != nil {
			return result{}, err
		}
		if !found {
			return unknown(execution), nil
		}
		return x.Result, nil
	}
	select {
	case <-p.done:
		e.mu.Lock()
		res := p.x.Result
		if e.cfg.ExecRecordDir != "" {
			// The record answers from here on.
			delete(e.procs, execution)
		}
		e.mu.Unlock()
		return res, nil
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
