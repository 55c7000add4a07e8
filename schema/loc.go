package schema

import (
	"strconv"
	"strings"
)

// loc is where a value sits in the data, a JSON pointer built only when a
// problem is found: each level of a generated validator keeps its token
// on the stack.
type loc struct {
	up    *loc
	name  string
	index int // an array index when name is ""
	root  bool
}

func (l *loc) String() string {
	if l.root {
		return "/"
	}
	var tokens []string
	for p := l; p != nil && !p.root; p = p.up {
		if p.name != "" {
			// A copy, so that no loc escapes to the heap.
			tokens = append(tokens, name(strings.Clone(p.name)))
		} else {
			tokens = append(tokens, strconv.Itoa(p.index))
		}
	}
	out := ""
	for i := len(tokens) - 1; i >= 0; i-- {
		out += "/" + tokens[i]
	}
	return out
}
