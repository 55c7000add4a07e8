package schema

import (
	"math/big"
	"testing"
)

// TestNumbersAreJudgedAsMathBigDoes holds isInteger and below to the
// library's arithmetic, math/big's, on the numbers where a shortcut goes
// wrong.
func TestNumbersAreJudgedAsMathBigDoes(t *testing.T) {
	lits := []string{
		"0", "-0", "1", "-1", "7", "10", "0.0", "-0.0", "0e5", "0e99999999999999999999", "0.000e-9999999",
		"1.0", "1.5", "10E-1", "100e-2", "100e-3", "0.5e1", "1e3", "1e+3", "1E-0", "-1e-1", "2.50e1",
		"1e1000000", "1e1000001", "1e-1000000", "10e-1000001", "1e9223372036854775807", "1e9223372036854775808",
		"1e-9223372036854775808", "1.5e-9223372036854775807", "99999999999999999999", "-99999999999999999999",
		"123456789012345678", "1234567890123456789", "0.00001e5", "0.00001e4", "100000000000000000000e-19",
		"-100000000000000000000e-20", "1.00000000000000000000000001", "5e-324", "-5", "0.1e1",
	}
	for _, lit := range lits {
		r, ok := new(big.Rat).SetString(lit)
		want := ok && r.IsInt()
		if got := isInteger([]byte(lit)); got != want {
			t.Errorf("isInteger(%s) = %t, math/big says %t", lit, got, want)
		}
		if !want {
			continue
		}
		for _, min := range []int64{1, 0, -1, 5, 100, 1e17, -1e17} {
			if got, want := below([]byte(lit), min), r.Cmp(new(big.Rat).SetInt64(min)) < 0; got != want {
				t.Errorf("below(%s, %d) = %t, math/big says %t", lit, min, got, want)
			}
		}
	}
}
