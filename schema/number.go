package schema

import (
	"math/big"
	"strconv"
)

// isInteger says whether a JSON number is an integer as the library judges
// one: by its value, so 1.0 and 1e3 are, and by math/big's parse, which
// refuses exponents beyond a million (those are not integers to it).
func isInteger(lit []byte) bool {
	if plain(lit) {
		return true
	}
	r, ok := new(big.Rat).SetString(string(lit))
	return ok && r.IsInt()
}

// below says whether an integer-valued JSON number is less than min.
func below(lit []byte, min int64) bool {
	if plain(lit) && len(lit) <= 18 {
		n, err := strconv.ParseInt(string(lit), 10, 64)
		if err == nil {
			return n < min
		}
	}
	r, ok := new(big.Rat).SetString(string(lit))
	return ok && r.Cmp(new(big.Rat).SetInt64(min)) < 0
}

// plain says a number has neither fraction nor exponent.
func plain(lit []byte) bool {
	for _, c := range lit {
		if c == '.' || c == 'e' || c == 'E' {
			return false
		}
	}
	return true
}
