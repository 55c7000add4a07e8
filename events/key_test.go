package events

import (
	"strings"
	"testing"
)

func TestCheckKey(t *testing.T) {
	good := []string{"a", "box-7", "Hive_1", "0", strings.Repeat("a", 63)}
	bad := []string{"", "-a", "_a", "a.b", "a*", ">", "a b", "..", "a/b", `a\b`, strings.Repeat("a", 64), "ü", "a\n", "a;b", "a'b"}
	for _, k := range good {
		if err := CheckKey(k); err != nil {
			t.Errorf("%q refused: %v", k, err)
		}
	}
	for _, k := range bad {
		if err := CheckKey(k); err == nil {
			t.Errorf("%q accepted", k)
		}
	}
}

func TestCheckVersion(t *testing.T) {
	good := []string{"1.0.0", "0.1.2", "10.20.30-rc.1+build.7", "1.0.0-alpha-1"}
	bad := []string{"", "v1.0.0", "1.0", "01.0.0", "../1.0.0", "/etc/passwd", "https://evil/1.0.0", "1.0.0/../../x", "1.0.0 ", "1.0.0\n", "1.0.0+" + strings.Repeat("a", 200)}
	for _, v := range good {
		if err := CheckVersion(v); err != nil {
			t.Errorf("%q refused: %v", v, err)
		}
	}
	for _, v := range bad {
		if err := CheckVersion(v); err == nil {
			t.Errorf("%q accepted", v)
		}
	}
}

func FuzzCheckKey(f *testing.F) {
	for _, s := range []string{"box-7", "a.b", "..", "a/b", "*", ">", "ü"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		if CheckKey(key) != nil {
			return
		}
		// Whatever passes must be safe as a subject token, a file name
		// and an identifier part.
		if key == "" || len(key) > 63 || strings.ContainsAny(key, ".*> /\\\x00'\";") || strings.HasPrefix(key, "-") {
			t.Fatalf("unsafe key accepted: %q", key)
		}
		for _, r := range key {
			if r > 127 {
				t.Fatalf("non-ASCII key accepted: %q", key)
			}
		}
	})
}

func TestIsKeyIsKeyPattern(t *testing.T) {
	for _, k := range []string{"", "a", "A-b_c", "-a", "_a", "a.b", "a b", "ü", "a\x00", "a\n", "a*", ">",
		strings.Repeat("a", 63), strings.Repeat("a", 64), "0" + strings.Repeat("-", 62), "a\xff"} {
		if got, want := isKey(k), keyPattern.MatchString(k); got != want {
			t.Errorf("%q: loop says %t, KeyPattern %t", k, got, want)
		}
	}
}
