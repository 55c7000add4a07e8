package schema

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// The words of a problem are the JSON Schema library's where its own hold
// no part of the value (types, counts, the schema's values), and Steward's
// where they would (a pattern, a length, a bound): data holds secrets (a
// plaintext pasted where age ciphertext belongs), and these errors reach
// logs, dead letters' headers and JetStream's advisories. The differential
// tests hold the generated validators to the oracle's words.

// printer formats counts as the library's messages do ("1,000").
var printer = message.NewPrinter(language.English)

// missingRule words required properties that are absent, in the schema's
// order.
func missingRule(missing []string) string {
	if len(missing) == 1 {
		return "missing property " + quote(missing[0])
	}
	q := make([]string, len(missing))
	for i, m := range missing {
		q[i] = quote(m)
	}
	return "missing properties " + strings.Join(q, ", ")
}

// extraRule words the properties a closed object does not allow, each
// once however often the data repeats it.
func extraRule(extra []string) string {
	slices.Sort(extra)
	return "additional properties " + names(slices.Compact(extra)) + " not allowed"
}

// itemsRule words an array's count against minItems or maxItems.
func itemsRule(keyword string, got, want int) string {
	return printer.Sprintf("%s: got %d, want %d", keyword, got, want)
}

// quote is the library's quoting of a schema's own value or name.
func quote(s string) string {
	s = fmt.Sprintf("%q", s)
	s = strings.ReplaceAll(s, `\"`, `"`)
	s = strings.ReplaceAll(s, `'`, `\'`)
	return "'" + s[1:len(s)-1] + "'"
}

// name prints a property name taken from the data: escaped and bounded,
// since a name, unlike a value, is worth showing (an unknown field).
func name(s string) string {
	const limit = 64
	if len(s) > limit {
		s = s[:limit] + "…"
	}
	if q := strconv.Quote(s); q[1:len(q)-1] != s {
		return q
	}
	return s
}

// fieldName matches what a field of Steward's data is called: a name
// taken from the data is shown only when it looks like one, since a
// pasted secret can land in a key as well as in a value.
var fieldName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_]{0,31}$`)

// names lists unknown property names, withholding any that is not a
// plausible field name.
func names(list []string) string {
	const most = 5
	out := make([]string, 0, min(len(list), most))
	withheld := 0
	for _, n := range list {
		if !fieldName.MatchString(n) {
			withheld++
			continue
		}
		if len(out) < most {
			out = append(out, strconv.Quote(n))
		}
	}
	if shown := len(out); shown < len(list)-withheld {
		out = append(out, fmt.Sprintf("and %d more", len(list)-withheld-shown))
	}
	if withheld > 0 {
		out = append(out, fmt.Sprintf("%d whose names are withheld (not field names)", withheld))
	}
	return strings.Join(out, ", ")
}
