// Package redact is Steward's one rule for what of a secret may leave a
// process: nothing. Every place that logs an error, stores it in a status
// document or a dead letter's reason, prints it to an operator, puts it on a
// span or renders it in the console passes the text through Line (or
// Secrets, where the text keeps its lines).
//
// Secrets travel on the bus as age armored blocks, and an age identity
// (AGE-SECRET-KEY-1…) can reach an error through a misconfigured file. Both
// are elided before anything else is done to the text: a cut made first can
// drop a block's END line, and a block without its END line is still a
// secret, so the pattern takes a BEGIN line to the end of the text when no
// END follows.
package redact

import (
	"regexp"
	"strings"
	"unicode/utf8"
)

// Elided is what stands where a secret was.
const Elided = "[elided]"

// MaxLine is how long a line Line returns may be, in bytes, before "…": a
// reason must fit a NATS header and stay readable in a table.
const MaxLine = 2000

// secret matches an armored block (age ciphertext, a PEM key), ended or not,
// and an age identity.
var secret = regexp.MustCompile(`(?s)-----BEGIN [A-Z0-9 ]+-----.*?(-----END [A-Z0-9 ]+-----|$)|AGE-SECRET-KEY-1[0-9A-Za-z]+`)

// Secrets replaces every armored block and age identity in s by Elided and
// leaves the rest, line breaks included, as it was.
func Secrets(s string) string {
	if !strings.Contains(s, "-----BEGIN ") && !strings.Contains(s, "AGE-SECRET-KEY-1") {
		return s
	}
	return secret.ReplaceAllString(s, Elided)
}

// Line is s with its secrets elided, its white space folded onto one line,
// and cut at MaxLine bytes (on a character's boundary) with "…" after.
func Line(s string) string {
	return Cut(strings.Join(strings.Fields(Secrets(s)), " "), MaxLine)
}

// Cut returns s if it is at most n bytes long, or else its first n bytes
// (fewer if the n-th would split a character) followed by "…". It elides
// nothing: cut only text that has been through Secrets or Line.
func Cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
