package schema

import (
	"strconv"
)

// A JSON number is judged as the library judges it, by math/big's
// Rat.SetString of its text, but without doing the arithmetic: 1e999999
// costs math/big some 24 ms, and data may repeat a field thousands of
// times. TestNumbersAreJudgedAsMathBigDoes holds the two together.

// number is a JSON number's text taken apart: ±digits × 10^exp5, where
// digits are the integer and fraction digits as written.
type number struct {
	neg    bool
	digits []byte
	exp5   int64
	ok     bool // Rat.SetString would parse it
}

// parseNumber takes apart text that scanner.number accepted.
func parseNumber(lit []byte) number {
	n := number{ok: true}
	i := 0
	if i < len(lit) && lit[i] == '-' {
		n.neg = true
		i++
	}
	start := i
	var digits []byte
	fcount := 0
	for ; i < len(lit) && lit[i] != 'e' && lit[i] != 'E'; i++ {
		if lit[i] == '.' {
			// Copied only when there is a fraction, which is rare.
			digits = append(append(digits, lit[start:i]...), lit[i+1:indexExp(lit, i)]...)
			fcount = indexExp(lit, i) - i - 1
			i = indexExp(lit, i)
			break
		}
	}
	if digits == nil {
		digits = lit[start:i]
	}
	n.digits = digits
	var exp int64
	if i < len(lit) {
		// Rat.SetString reads the exponent with strconv.ParseInt:
		// one that does not fit 64 bits fails the parse.
		e := string(lit[i+1:])
		if len(e) > 0 && e[0] == '+' {
			e = e[1:]
		}
		var err error
		if exp, err = strconv.ParseInt(e, 10, 64); err != nil {
			n.ok = false
			return n
		}
	}
	if n.zero() {
		return n
	}
	// As math/big computes it, wrapping included.
	exp5 := int64(-fcount)
	exp5 += exp
	m := exp5
	if m < 0 {
		m = -m
		if m < 0 {
			n.ok = false
			return n
		}
	}
	if m > 1e6 {
		// math/big refuses exponents this large.
		n.ok = false
		return n
	}
	n.exp5 = exp5
	return n
}

func indexExp(lit []byte, from int) int {
	for i := from; i < len(lit); i++ {
		if lit[i] == 'e' || lit[i] == 'E' {
			return i
		}
	}
	return len(lit)
}

func (n number) zero() bool {
	for _, c := range n.digits {
		if c != '0' {
			return false
		}
	}
	return true
}

// integer says the value has no fraction: 10^-exp5 divides the digits.
func (n number) integer() bool {
	if n.exp5 >= 0 || n.zero() {
		return true
	}
	zeros := int64(0)
	for i := len(n.digits) - 1; i >= 0 && n.digits[i] == '0'; i-- {
		zeros++
	}
	return zeros >= -n.exp5
}

// isInteger says whether a JSON number is an integer as the library judges
// one: by its value, so 1.0 and 1e3 are, and only when math/big parses it,
// which it refuses for exponents beyond a million.
func isInteger(lit []byte) bool {
	n := parseNumber(lit)
	return n.ok && n.integer()
}

// maxBound is the largest bound below compares against: the generator
// refuses a larger one.
const maxBound = 1e17

// below says whether an integer-valued JSON number (isInteger) is less
// than min, |min| at most maxBound.
func below(lit []byte, min int64) bool {
	n := parseNumber(lit)
	if n.zero() {
		return 0 < min
	}
	// The integer's digits: leading zeros off, then exp5 zeros on or
	// off (those are zeros, as the value is an integer).
	d := n.digits
	for len(d) > 1 && d[0] == '0' {
		d = d[1:]
	}
	if count := int64(len(d)) + n.exp5; count > 18 {
		// At least 10^18, beyond any bound.
		return n.neg
	}
	var v int64
	for _, c := range d[:int64(len(d))+min64(n.exp5, 0)] {
		v = v*10 + int64(c-'0')
	}
	for range max(n.exp5, 0) {
		v *= 10
	}
	if n.neg {
		v = -v
	}
	return v < min
}

func min64(a, b int64) int64 {
	if a < b {
		return a
	}
	return b
}
