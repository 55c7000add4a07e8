package main

import (
	"context"

	"github.com/spf13/pflag"

	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/converge"
	"github.com/steward-dev/steward/workers/credential"
	"github.com/steward-dev/steward/workers/join"
	"github.com/steward-dev/steward/workers/provision"
)

// kinds is every worker Steward has. `worker`, `replay` and `dev` are built
// from it, so a new worker is one line here (workers.Package is the
// contract its package meets).
var kinds = []kind{
	define("converge", (*converge.Config).AddFlags, converge.New, converge.Dev),
	define("join", (*join.Config).AddFlags, join.New, join.Dev),
	define("credential", (*credential.Config).AddFlags, credential.New, credential.Dev),
	define("provision", (*provision.Config).AddFlags, provision.New, provision.Dev),
}

// handler is what every worker package's *Worker is.
type handler = workers.Service

// kind is one worker package behind a shape that does not depend on its
// Config type.
type kind struct {
	name string
	// bind registers the worker's flags on fs and returns what builds the
	// worker from them once they are parsed.
	bind func(fs *pflag.FlagSet) func() (handler, error)
	// dev builds a development instance whose keys and fixtures live under
	// dir, with the lines telling a newcomer how to feed it.
	dev func(ctx context.Context, dir string) (handler, []string, error)
}

// define registers a worker package by its four parts; the type parameters
// are inferred, so the line in kinds names no types.
func define[C any, W handler](
	name string,
	addFlags func(*C, *pflag.FlagSet),
	newWorker func(C) (W, error),
	dev func(context.Context, string) (C, []string, error),
) kind {
	p := workers.Package[C, W]{Name: name, AddFlags: addFlags, New: newWorker, Dev: dev}
	return kind{name: p.Name, bind: p.Bind, dev: p.DevService}
}
