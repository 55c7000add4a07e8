package main

import (
	"context"

	"github.com/spf13/pflag"

	"github.com/steward-dev/steward/workers"
)

// service is a worker as `steward worker` runs it: the Handler, the Spec it
// consumes, and Close for whatever it holds between events (a connection
// pool). A worker package's New returns one.
type service interface {
	workers.Handler
	Spec() workers.Spec
	Close() error
}

// plugin is the contract a worker package meets to be a `steward worker`:
// its name, how its Config is read from flags (each flag has the
// STEWARD_<FLAG> environment twin), how a service is made from a Config,
// and how `steward dev` prepares a development instance. A worker package
// exports the four functions and no plugin value; define (kinds.go) builds
// one from them.
type plugin[C any, W service] struct {
	// name is the worker's name: `steward worker <name>`, Spec.Name.
	name string
	// addFlags registers the Config's flags on fs, with their defaults.
	addFlags func(cfg *C, fs *pflag.FlagSet)
	// newWorker checks a Config and returns the worker, failing at start
	// rather than on every event for what no event can fix (a key it
	// cannot read).
	newWorker func(cfg C) (W, error)
	// dev makes a development instance's keys and fixtures under dir and
	// returns its Config and the lines that tell a newcomer how to feed
	// it (a `steward publish` command). Nil: the worker has no dev mode.
	dev func(ctx context.Context, dir string) (C, []string, error)
}

// bind registers the plugin's flags on fs and returns what builds the
// worker from them once fs is parsed.
func (p plugin[C, W]) bind(fs *pflag.FlagSet) func() (service, error) {
	cfg := new(C)
	p.addFlags(cfg, fs)
	return func() (service, error) { return p.build(*cfg) }
}

// devService builds the development instance whose keys and fixtures live
// under dir, with the lines telling a newcomer how to feed it.
func (p plugin[C, W]) devService(ctx context.Context, dir string) (service, []string, error) {
	if p.dev == nil {
		return nil, nil, errDevUnsupported(p.name)
	}
	cfg, lines, err := p.dev(ctx, dir)
	if err != nil {
		return nil, nil, err
	}
	s, err := p.build(cfg)
	return s, lines, err
}

// build returns newWorker's worker as a service, and a nil interface (not
// a nil W inside one) when newWorker fails.
func (p plugin[C, W]) build(cfg C) (service, error) {
	w, err := p.newWorker(cfg)
	if err != nil {
		return nil, err
	}
	return w, nil
}

type errDevUnsupported string

func (e errDevUnsupported) Error() string {
	return "worker " + string(e) + " has no development mode"
}
