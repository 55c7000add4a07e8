package schema

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// TestPatternsMatchAsRegexpDoes holds the loop matcher to regexp, on the
// schemas' patterns and on shapes where greedy matching would go wrong
// (which must fall back to regexp), over strings built from the runes the
// patterns care about.
func TestPatternsMatchAsRegexpDoes(t *testing.T) {
	exprs := []string{
		`^[\x21-\x7e]+$`, `^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$`, `^-----BEGIN AGE ENCRYPTED FILE-----`,
		`^sha256:[0-9a-f]{64}$`, `^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`,
		`^a*a$`, `^a*b?a$`, `^a{0,2}b`, `^[ab]+b$`, `^a?b*$`, `^x.y$`, `^(?i)ab$`, `^a+?$`, `^é+\x{FFFD}?$`, `ab`, `^ab|cd$`,
	}
	alphabet := []string{"a", "b", "x", "y", "A", "Z", "0", "9", "-", "_", ".", "+", "!", "~", " ", "\n", "é", "\xff", "\xc3", "\ufffd", "-----BEGIN AGE ENCRYPTED FILE-----", "sha256:", "1.2.3"}
	rng := rand.New(rand.NewPCG(1, 2))
	simpleOnes := 0
	for _, expr := range exprs {
		p, re := compilePattern(expr), regexp.MustCompile(expr)
		if p.items != nil {
			simpleOnes++
		}
		for range 20000 {
			var b strings.Builder
			for range rng.IntN(12) {
				b.WriteString(alphabet[rng.IntN(len(alphabet))])
			}
			if rng.IntN(20) == 0 {
				b.WriteString(strings.Repeat("a", 60+rng.IntN(8)))
			}
			v := []byte(b.String())
			if got, want := p.match(v), re.Match(v); got != want {
				t.Fatalf("%s on %q: loop says %t, regexp %t", expr, v, got, want)
			}
		}
	}
	if simpleOnes < 4 {
		t.Fatalf("only %d patterns take the loop", simpleOnes)
	}
	for _, expr := range []string{`^a*a$`, `^a*b?a$`, `^(?i)ab$`, `^a+?$`} {
		if compilePattern(expr).items != nil {
			t.Errorf("%s takes the loop, where greedy matching is wrong", expr)
		}
	}
}
