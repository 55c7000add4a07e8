package ops

import (
	"slices"

	"github.com/steward-dev/steward/events"
)

// WorkerTypes are the event types a worker consumes, from the one table
// history, checkpoints and the console read (workerTypes). A worker not
// named there (a fifth one) is given every kind.
func WorkerTypes(worker string) []string {
	if types, ok := workerTypes[worker]; ok {
		return slices.Clone(types)
	}
	var all []string
	for _, k := range events.Kinds() {
		all = append(all, k.Type)
	}
	return all
}

// WorkerOf is the worker that consumes events of typ, or "" when none of
// Steward's workers does.
func WorkerOf(typ string) string {
	for w, types := range workerTypes {
		if slices.Contains(types, typ) {
			return w
		}
	}
	return ""
}

// Workers are the names of Steward's workers, sorted.
func Workers() []string {
	out := make([]string, 0, len(workerTypes))
	for w := range workerTypes {
		out = append(out, w)
	}
	slices.Sort(out)
	return out
}
