package schema

import (
	"regexp"
	"regexp/syntax"
	"unicode/utf8"
)

// pattern is a schema's "pattern", matched as the library matches it: by
// Go's regexp (not ECMA-262's engine). The patterns Steward's schemas use
// are anchored runs of literals and character classes, which need no
// backtracking; those are matched by a loop over the runes, the rest by
// regexp itself.
type pattern struct {
	re    *regexp.Regexp
	items []item // nil: use re
	end   bool   // anchored at the end of the text
}

// item is one step of a simple pattern: a run of ASCII literals, or a
// literal rune or a class repeated min to max times (max -1: no bound).
type item struct {
	ascii    string // when set, the item is this run, once
	ranges   []rune // pairs, as regexp/syntax keeps them
	min, max int
}

func compilePattern(expr string) *pattern {
	p := &pattern{re: regexp.MustCompile(expr)}
	if items, end, ok := simple(expr); ok {
		p.items, p.end = items, end
	}
	return p
}

// simple turns an expression of the form ^(literal|class|class{m,n}|
// class+|class*|class?)...$? into items, when matching them greedily is
// the same as matching the expression: nothing that may follow an item
// that may repeat can start with what it consumes.
func simple(expr string) ([]item, bool, bool) {
	re, err := syntax.Parse(expr, syntax.Perl)
	if err != nil || re.Op != syntax.OpConcat || len(re.Sub) < 2 || re.Sub[0].Op != syntax.OpBeginText {
		return nil, false, false
	}
	subs := re.Sub[1:]
	end := false
	if last := subs[len(subs)-1]; last.Op == syntax.OpEndText {
		end = true
		subs = subs[:len(subs)-1]
	}
	var items []item
	for _, s := range subs {
		if s.Flags&syntax.FoldCase != 0 {
			return nil, false, false
		}
		switch s.Op {
		case syntax.OpLiteral:
			for _, r := range s.Rune {
				items = append(items, item{ranges: []rune{r, r}, min: 1, max: 1})
			}
			continue
		case syntax.OpCharClass:
			items = append(items, item{ranges: s.Rune, min: 1, max: 1})
			continue
		}
		min, max := 0, 0
		switch s.Op {
		case syntax.OpRepeat:
			min, max = s.Min, s.Max
		case syntax.OpPlus:
			min, max = 1, -1
		case syntax.OpStar:
			min, max = 0, -1
		case syntax.OpQuest:
			min, max = 0, 1
		default:
			return nil, false, false
		}
		one := s.Sub[0]
		if one.Flags&syntax.FoldCase != 0 || s.Flags&syntax.NonGreedy != 0 {
			return nil, false, false
		}
		switch {
		case one.Op == syntax.OpCharClass:
			items = append(items, item{ranges: one.Rune, min: min, max: max})
		case one.Op == syntax.OpLiteral && len(one.Rune) == 1:
			items = append(items, item{ranges: []rune{one.Rune[0], one.Rune[0]}, min: min, max: max})
		default:
			return nil, false, false
		}
	}
	// What may follow an item that may repeat is every item up to the
	// first one that must match once.
	for i := range items {
		if items[i].min == items[i].max {
			continue
		}
		for j := i + 1; j < len(items); j++ {
			if overlap(items[i].ranges, items[j].ranges) {
				return nil, false, false
			}
			if items[j].min > 0 {
				break
			}
		}
	}
	return foldASCII(items), end, true
}

// foldASCII joins runs of single ASCII literals into one item, compared
// as bytes: an ASCII byte of the data is the rune it reads as, and no
// other byte or sequence reads as an ASCII rune.
func foldASCII(items []item) []item {
	var out []item
	for _, it := range items {
		lit := it.min == 1 && it.max == 1 && len(it.ranges) == 2 && it.ranges[0] == it.ranges[1] && it.ranges[0] < utf8.RuneSelf
		if !lit {
			out = append(out, it)
			continue
		}
		if n := len(out); n > 0 && out[n-1].ascii != "" {
			out[n-1].ascii += string(it.ranges[0])
			continue
		}
		out = append(out, item{ascii: string(it.ranges[0]), min: 1, max: 1})
	}
	return out
}

func overlap(a, b []rune) bool {
	for i := 0; i+1 < len(a); i += 2 {
		for j := 0; j+1 < len(b); j += 2 {
			if a[i] <= b[j+1] && b[j] <= a[i+1] {
				return true
			}
		}
	}
	return false
}

func (it *item) has(r rune) bool {
	for i := 0; i+1 < len(it.ranges); i += 2 {
		if it.ranges[i] <= r && r <= it.ranges[i+1] {
			return true
		}
	}
	return false
}

// match reports whether v, a decoded string, matches.
func (p *pattern) match(v []byte) bool {
	if p.items == nil {
		return p.re.Match(v)
	}
	i := 0
	for k := range p.items {
		it := &p.items[k]
		if it.ascii != "" {
			if len(v)-i < len(it.ascii) || string(v[i:i+len(it.ascii)]) != it.ascii {
				return false
			}
			i += len(it.ascii)
			continue
		}
		n := 0
		for it.max < 0 || n < it.max {
			if i >= len(v) {
				break
			}
			// Bad UTF-8 reads as U+FFFD, one byte at a time, as it
			// does for regexp.
			r, size := rune(v[i]), 1
			if r >= utf8.RuneSelf {
				r, size = utf8.DecodeRune(v[i:])
			}
			if !it.has(r) {
				break
			}
			i += size
			n++
		}
		if n < it.min {
			return false
		}
	}
	return !p.end || i == len(v)
}
