package ops

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Printable escapes what a terminal would act on rather than show: C0 and
// C1 controls (ESC starts cursor moves and OSC 52 clipboard writes), DEL,
// Unicode format characters (bidi overrides that reorder a line), line and
// paragraph separators, and bytes that are not UTF-8. The result is one
// line of printable text. Every text a dead letter carries was written by
// whoever could publish, so it passes here before a log line or a
// terminal shows it.
func Printable(s string) string {
	if !strings.ContainsFunc(s, Unprintable) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r < 0x80 && Unprintable(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case Unprintable(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// Unprintable says a terminal would act on r, or that r stands for a byte
// that is not UTF-8.
func Unprintable(r rune) bool {
	return r == utf8.RuneError || r < 0x20 || (r >= 0x7f && r < 0xa0) ||
		unicode.Is(unicode.Cf, r) || unicode.Is(unicode.Zl, r) || unicode.Is(unicode.Zp, r)
}
