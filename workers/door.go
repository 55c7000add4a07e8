package workers

import (
	"fmt"
	"time"

	"github.com/steward-dev/steward/workers/internal/enginetest"
)

// What this package does not export but its own tree needs reaches it
// through workers/internal/enginetest, which only the workers tree can
// import: workertest runs handlers through this engine, not a copy of its
// rules (the same keyed queue, executor and settler over the bucket,
// streams and messages of workers/internal/memory, memoryengine.go) and
// turns two test-only knobs; workers/replay runs stored events through a
// handler with the executor and the instance's checks (replay.go).
func init() {
	enginetest.NewEngine = newMemoryEngine
	enginetest.StatusInterval = func(d time.Duration) any { return Option(func(o *options) { o.statusInterval = d }) }
	enginetest.Resync = func(d time.Duration) any { return Option(func(o *options) { o.resync = d }) }
	enginetest.NewReplayer = newReplayer
}

// engineArgs are a Spec, a Handler and Options as the door passes them
// (enginetest cannot name this package's types).
func engineArgs(spec, handler any, options []any) (Spec, Handler, []Option, error) {
	sp, ok := spec.(Spec)
	if !ok {
		return Spec{}, nil, nil, fmt.Errorf("%w: the spec is a %T, not a workers.Spec", ErrInvalidSpec, spec)
	}
	h, ok := handler.(Handler)
	if !ok {
		return Spec{}, nil, nil, fmt.Errorf("%w: the handler is a %T, not a workers.Handler", ErrInvalidSpec, handler)
	}
	opts := make([]Option, 0, len(options))
	for _, o := range options {
		opt, ok := o.(Option)
		if !ok {
			return Spec{}, nil, nil, fmt.Errorf("%w: an option is a %T, not a workers.Option", ErrInvalidSpec, o)
		}
		opts = append(opts, opt)
	}
	return sp, h, opts, nil
}
