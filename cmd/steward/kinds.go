package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/converge"
	"github.com/steward-dev/steward/workers/credential"
	"github.com/steward-dev/steward/workers/join"
	"github.com/steward-dev/steward/workers/provision"
)

// kinds is every worker Steward has. `worker`, `replay` and `dev` are built
// from it, so a new worker is one line here (plugin, plugin.go, is the
// contract its package meets).
var kinds = []kind{
	define("converge", (*converge.Config).AddFlags, converge.New, converge.Dev, "install", converge.SpecFor),
	define("join", (*join.Config).AddFlags, join.New, join.Dev, "box", join.SpecFor),
	define("credential", (*credential.Config).AddFlags, credential.New, credential.Dev, "hive", credential.SpecFor),
	define("provision", (*provision.Config).AddFlags, provision.New, provision.Dev, "machine", provision.SpecFor),
}

// kind is one worker package behind a shape that does not depend on its
// Config type.
type kind struct {
	name string
	// bind registers the worker's flags on fs and returns what builds the
	// worker from them once they are parsed.
	bind func(fs *pflag.FlagSet) func() (service, error)
	// dev builds a development instance whose keys and fixtures live under
	// dir, with the lines telling a newcomer how to feed it.
	dev func(ctx context.Context, dir string) (service, []string, error)
	// instanceFlag is the flag naming the instance (--hive, --install,
	// ...), and spec the instance's Spec from it alone: a dry run only
	// decodes and validates, so it asks for nothing else.
	instanceFlag string
	spec         func(instance string) workers.Spec
}

// define registers a worker package by its four parts, the flag naming its
// instance and its SpecFor; the type parameters are inferred, so the line
// in kinds names no types.
func define[C any, W service](
	name string,
	addFlags func(*C, *pflag.FlagSet),
	newWorker func(C) (W, error),
	dev func(context.Context, string) (C, []string, error),
	instanceFlag string,
	spec func(instance string) workers.Spec,
) kind {
	p := plugin[C, W]{name: name, addFlags: addFlags, newWorker: newWorker, dev: dev}
	return kind{name: p.name, bind: p.bind, dev: p.devService, instanceFlag: instanceFlag, spec: spec}
}

// dryRunSpec is the Spec a dry run reads with: the instance's, from its
// flag alone, with a handler that is never called (a dry run handles
// nothing), so the rest of the worker's configuration is not asked for.
func (k kind) dryRunSpec(fs *pflag.FlagSet) (workers.Spec, workers.Handler, error) {
	instance := ""
	if f := fs.Lookup(k.instanceFlag); f != nil {
		instance = f.Value.String()
	}
	if err := events.CheckKey(instance); err != nil {
		return workers.Spec{}, nil, fmt.Errorf("--%s %q names no %s instance (%w): a dry run needs only --%s, the instance whose events to read", k.instanceFlag, instance, k.name, err, k.instanceFlag)
	}
	return k.spec(instance), workers.HandlerFunc(func(context.Context, *workers.Delivery) error {
		return errors.New("a dry run handles nothing")
	}), nil
}
