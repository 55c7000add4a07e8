package devstack

import (
	"context"
	"fmt"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/natsauth"
	"github.com/steward-dev/steward/internal/redact"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/converge"
	"github.com/steward-dev/steward/workers/provision"
)

// WorkerState is one worker of the stack: running (Runtime set), or not,
// and then Err says why.
type WorkerState struct {
	Name string
	// Runtime runs the instance; its Spec is Spec.
	Runtime *workers.Runtime
	Spec    workers.Spec
	// Lines tell a newcomer how to feed the instance.
	Lines []string
	Err   error
}

// startWorkers starts a development instance of every worker, each
// connected as itself. One that cannot start is reported in Workers, and
// the others run.
func (s *Stack) startWorkers(ctx context.Context) {
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.runCancel = cancel
	for _, w := range s.o.workers {
		s.Workers = append(s.Workers, s.startWorker(ctx, runCtx, w))
	}
}

// startWorker starts w's instance, running until Stop.

func (s *Stack) startWorker(ctx, runCtx context.Context, w Worker) WorkerState {
	st := WorkerState{Name: w.Name}
	h, lines, err := s.devService(ctx, w)
	if err == nil {
		st.Runtime, err = s.newRuntime(ctx, h)
	}
	if err != nil {
		if h != nil {
			h.Close()
		}
		st.Err = err
		return st
	}
	st.Spec, st.Lines = h.Spec(), lines
	s.mu.Lock()
	s.running = append(s.running, st.Runtime)
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer h.Close()
		if err := st.Runtime.Run(runCtx); err != nil {
			s.o.log.Error().Err(err).Str("worker", w.Name).Msg("worker stopped")
		}
	}()
	return st
}

// devService builds a worker's development instance; provision's runs
// against the stack's PostgreSQL, or not at all, and converge's from what
// the bucket holds of its install.
func (s *Stack) devService(ctx context.Context, w Worker) (Service, []string, error) {
	switch w.Name {
	case converge.Name:
		return s.convergeService(ctx)
	case provision.Name:
		return s.provisionService(ctx)
	default:
		return w.Dev(ctx, s.Dir)
	}
}

// provisionService builds provision's development instance against the
// stack's PostgreSQL.
func (s *Stack) provisionService(ctx context.Context) (Service, []string, error) {
	if s.Postgres.URL == "" {
		return nil, nil, fmt.Errorf("it needs PostgreSQL: %s; grant events wait in the stream until it runs", redact.Line(s.Postgres.Why.Error()))
	}
	cfg, lines, err := provision.DevAt(ctx, s.Dir, s.Postgres.URL)
	return built(provision.New, cfg, lines, err)
}

// convergeService builds converge's development instance from its
// installed-version document, read as the operator and believed only as
// converge's own (events.Store verifies it), so a restarted dev says the
// version the install is at and offers the releases above it, never a
// first start or a downgrade.
func (s *Stack) convergeService(ctx context.Context) (Service, []string, error) {
	doc, err := s.opDocs.Get(ctx, events.StateKey(converge.Name, converge.DevInstall, converge.InstalledDoc))
	if err != nil {
		return nil, nil, fmt.Errorf("converge's installed version: %w", err)
	}
	s.Converge = converge.DevStateOf(doc)
	cfg, lines, err := converge.DevFrom(ctx, s.Dir, s.Converge)
	return built(converge.New, cfg, lines, err)
}

// built makes the worker of a development Config (err is the Config's
// own failure), returning a nil interface, not a nil *Worker inside one,
// when it fails.
func built[C any, W Service](newWorker func(C) (W, error), cfg C, lines []string, err error) (Service, []string, error) {
	if err != nil {
		return nil, nil, err
	}
	h, err := newWorker(cfg)
	if err != nil {
		return nil, nil, err
	}
	return h, lines, nil
}

// newRuntime connects as h's instance, with credentials scoped to it, and
// makes its runtime.
func (s *Stack) newRuntime(ctx context.Context, h Service) (*workers.Runtime, error) {
	spec := h.Spec()
	id, err := natsauth.Worker(spec.Name, spec.Instance)
	if err != nil {
		return nil, err
	}
	path, err := s.writeCreds(id)
	if err != nil {
		return nil, err
	}
	_, js, err := s.connect(ctx, "steward dev "+id.Name(), path)
	if err != nil {
		return nil, err
	}
	signer, verifier, err := s.id.DocumentKeys(path, id.Name())
	if err != nil {
		return nil, err
	}
	var opts []workers.Option
	if s.o.workerOptions != nil {
		opts = s.o.workerOptions(s.o.registry)
	}
	return workers.New(js, spec, h, append(opts, workers.WithDocumentKeys(signer, verifier))...)
}
