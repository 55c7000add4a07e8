package redact_test

import (
	"strings"
	"testing"

	"github.com/steward-dev/steward/internal/redact"
)

const identity = "AGE-SECRET-KEY-1QYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQS0EXAMPLE"

const block = "-----BEGIN AGE ENCRYPTED FILE-----\nYWdlLWVuY3J5cHRpb24ub3JnL3YxCi0+IFgyNTUxOSBzZWNyZXQ\n-----END AGE ENCRYPTED FILE-----"

// long is an error of the shape that defeated the runtime's old copy: the
// secrets sit past the 2,000-byte cut, so cutting first dropped the block's
// END line and the identity, and eliding second found nothing to match.
func long() string {
	return "grant for dev-db refused: " + strings.Repeat("context ", 300) + block + " then " + identity + " and more " + strings.Repeat("x", 3000)
}

func TestLineElidesBeforeItCuts(t *testing.T) {
	for _, in := range []string{
		block, identity, long(),
		"before " + block[:60], // a block whose END line never came
		strings.Repeat("a", 1990) + block,
	} {
		got := redact.Line(in)
		for _, leak := range []string{"YWdlLWVuY3J5cHRpb24", "AGE-SECRET-KEY-1", "-----BEGIN"} {
			if strings.Contains(got, leak) {
				t.Fatalf("Line left %q in %.80q…", leak, got)
			}
		}
		if len(got) > redact.MaxLine+len("…") || strings.Contains(got, "\n") {
			t.Fatalf("Line gave %d bytes or a line break: %.80q…", len(got), got)
		}
	}
}

func TestSecretsKeepsTheRest(t *testing.T) {
	in := "first line\nkey " + identity + "\n" + block + "\nlast line"
	want := "first line\nkey " + redact.Elided + "\n" + redact.Elided + "\nlast line"
	if got := redact.Secrets(in); got != want {
		t.Fatalf("Secrets(%q) = %q, want %q", in, got, want)
	}
	for in, want := range map[string]string{
		"key AGE-SECRET-KEY-1QQQ2 leaked":             "key [elided] leaked",
		"truncated -----BEGIN AGE ENCRYPTED":          "truncated -----BEGIN AGE ENCRYPTED", // no whole BEGIN line: nothing armored
		"cut -----BEGIN AGE ENCRYPTED FILE-----\nabc": "cut [elided]",
	} {
		if got := redact.Secrets(in); got != want {
			t.Errorf("Secrets(%q) = %q, want %q", in, got, want)
		}
	}
	if got := redact.Secrets("nothing secret here"); got != "nothing secret here" {
		t.Fatalf("Secrets changed plain text: %q", got)
	}
}

func TestCutKeepsCharactersWhole(t *testing.T) {
	got := redact.Cut("ééé", 3) // é is two bytes: the cut falls inside the second
	if got != "é…" {
		t.Fatalf("Cut = %q, want %q", got, "é…")
	}
	if got := redact.Cut("short", 10); got != "short" {
		t.Fatalf("Cut changed a short string: %q", got)
	}
}
