package schema

import (
	"strings"
	"sync"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// maxDepth is encoding/json's nesting limit, so that data the oracle
// refuses as too deep is refused here too.
const maxDepth = 10000

// scanner walks JSON data once for a generated validator: it checks the
// syntax as encoding/json does and hands each value to the check the
// schema has for it, without building a document. A syntax error anywhere
// makes every problem found moot: the data is not JSON.
type scanner struct {
	data  []byte
	pos   int
	depth int
	bad   bool // a syntax error was found
	// problems are "<field>: <rule>"; nil until the first.
	problems []string
	// scratch holds the last unescaped string, taken from scratches
	// when a string first needs it.
	scratch *[]byte
	// want names a top-level field whose string value is kept in got
	// (an event's key), read in the same pass.
	want string
	got  string
}

// jsonType is a JSON value's type, as JSON Schema names them.
type jsonType uint8

const (
	typeNone jsonType = iota // not the start of a value
	typeObject
	typeArray
	typeString
	typeNumber
	typeBoolean
	typeNull
)

var typeNames = [...]string{"invalid", "object", "array", "string", "number", "boolean", "null"}

func (t jsonType) String() string { return typeNames[t] }

// fail marks the data as not JSON.
func (s *scanner) fail() { s.bad = true }

func (s *scanner) space() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// peek returns the type of the value that starts at the next
// non-space byte, without consuming it.
func (s *scanner) peek() jsonType {
	s.space()
	if s.bad || s.pos >= len(s.data) {
		s.fail()
		return typeNone
	}
	switch c := s.data[s.pos]; {
	case c == '{':
		return typeObject
	case c == '[':
		return typeArray
	case c == '"':
		return typeString
	case c == '-' || '0' <= c && c <= '9':
		return typeNumber
	case c == 't' || c == 'f':
		return typeBoolean
	case c == 'n':
		return typeNull
	}
	s.fail()
	return typeNone
}

// problem records a rule broken at a field.
func (s *scanner) problem(at *loc, rule string) {
	s.problems = append(s.problems, at.String()+": "+rule)
}

// wrongType records a value of the wrong type and skips it.
func (s *scanner) wrongType(at *loc, got jsonType, want string) {
	s.skip()
	if !s.bad {
		s.problem(at, "got "+got.String()+", want "+want)
	}
}

// end checks that nothing but space follows the top-level value.
func (s *scanner) end() {
	s.space()
	if s.pos != len(s.data) {
		s.fail()
	}
}

// skip consumes one value of any type, checking its syntax.
func (s *scanner) skip() {
	switch s.peek() {
	case typeObject:
		if !s.enter() {
			return
		}
		for more := s.first('}'); more; more = s.next('}') {
			s.key()
			s.skip()
		}
		s.depth--
	case typeArray:
		if !s.enter() {
			return
		}
		for more := s.first(']'); more; more = s.next(']') {
			s.skip()
		}
		s.depth--
	case typeString:
		s.str()
	case typeNumber:
		s.number()
	case typeBoolean, typeNull:
		s.literal()
	}
}

// enter consumes the '{' or '[' at pos.
func (s *scanner) enter() bool {
	s.pos++
	s.depth++
	if s.depth > maxDepth {
		s.fail()
	}
	return !s.bad
}

// first reports whether the container just entered has a first element,
// consuming the closing byte when it has none.
func (s *scanner) first(closing byte) bool {
	s.space()
	if s.bad || s.pos >= len(s.data) {
		s.fail()
		return false
	}
	if s.data[s.pos] == closing {
		s.pos++
		return false
	}
	return true
}

// next consumes the ',' before another element, or the closing byte.
func (s *scanner) next(closing byte) bool {
	s.space()
	if s.bad || s.pos >= len(s.data) {
		s.fail()
		return false
	}
	switch s.data[s.pos] {
	case ',':
		s.pos++
		return true
	case closing:
		s.pos++
		return false
	}
	s.fail()
	return false
}

// key consumes an object member's name and its ':', returning the name
// unescaped (valid until the next string is read).
func (s *scanner) key() []byte {
	if s.peek() != typeString {
		s.fail()
		return nil
	}
	k := s.str()
	s.space()
	if s.bad || s.pos >= len(s.data) || s.data[s.pos] != ':' {
		s.fail()
		return nil
	}
	s.pos++
	return k
}

func (s *scanner) literal() {
	var want string
	switch s.data[s.pos] {
	case 't':
		want = "true"
	case 'f':
		want = "false"
	default:
		want = "null"
	}
	if len(s.data)-s.pos < len(want) || string(s.data[s.pos:s.pos+len(want)]) != want {
		s.fail()
		return
	}
	s.pos += len(want)
}

// number consumes a number and returns its text, checked against JSON's
// grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *scanner) number() []byte {
	d, start := s.data, s.pos
	i := s.pos
	if i < len(d) && d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case i < len(d) && '1' <= d[i] && d[i] <= '9':
		i = digits(d, i)
	default:
		s.fail()
		return nil
	}
	if i < len(d) && d[i] == '.' {
		j := digits(d, i+1)
		if j == i+1 {
			s.fail()
			return nil
		}
		i = j
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		j := digits(d, i)
		if j == i {
			s.fail()
			return nil
		}
		i = j
	}
	s.pos = i
	return d[start:i]
}

func digits(d []byte, i int) int {
	for i < len(d) && '0' <= d[i] && d[i] <= '9' {
		i++
	}
	return i
}

// str consumes a string and returns its value as encoding/json would
// decode it (escapes resolved, bad UTF-8 and lone surrogates as U+FFFD,
// which regexp and utf8.RuneCount treat alike): the data itself when it
// needs no change, else the scanner's scratch.
func (s *scanner) str() []byte {
	d := s.data
	start := s.pos + 1
	i := start
	for i < len(d) {
		c := d[i]
		if c == '"' {
			s.pos = i + 1
			return d[start:i]
		}
		if c == '\\' || c < ' ' {
			break
		}
		i++
	}
	return s.unescape(i)
}

// unescape finishes a string that has escapes, from i, into scratch.
func (s *scanner) unescape(i int) []byte {
	d := s.data
	if s.scratch == nil {
		s.scratch = scratches.Get().(*[]byte)
	}
	b := append((*s.scratch)[:0], d[s.pos+1:i]...)
	for i < len(d) {
		c := d[i]
		switch {
		case c == '"':
			s.pos = i + 1
			*s.scratch = b
			return b
		case c < ' ':
			s.fail()
			return nil
		case c != '\\':
			b = append(b, c)
			i++
			continue
		}
		if i+1 >= len(d) {
			s.fail()
			return nil
		}
		switch d[i+1] {
		case '"', '\\', '/':
			b = append(b, d[i+1])
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'u':
			r := hex4(d, i+2)
			if r < 0 {
				s.fail()
				return nil
			}
			i += 6
			if utf16.IsSurrogate(r) {
				if i+1 < len(d) && d[i] == '\\' && d[i+1] == 'u' {
					if r2 := hex4(d, i+2); r2 >= 0 {
						if dec := utf16.DecodeRune(r, r2); dec != unicode.ReplacementChar {
							b = utf8.AppendRune(b, dec)
							i += 6
							continue
						}
					}
				}
				r = unicode.ReplacementChar
			}
			b = utf8.AppendRune(b, r)
			continue
		default:
			s.fail()
			return nil
		}
		i += 2
	}
	s.fail()
	return nil
}

// scratches lend scanners the buffer strings with escapes are decoded
// into: kept on the scanner, it would make every scanner escape to the
// heap.
var scratches = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// release returns the scratch buffer, unless it grew past what is worth
// keeping.
func (s *scanner) release() {
	if s.scratch != nil && cap(*s.scratch) <= 64<<10 {
		scratches.Put(s.scratch)
	}
	s.scratch = nil
}

// hex4 reads the four hex digits of a \u escape at i, or -1.
func hex4(d []byte, i int) rune {
	if i+4 > len(d) {
		return -1
	}
	var r rune
	for _, c := range d[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r*16 + rune(c)
	}
	return r
}

// extra adds an unknown property name to the list a closed object
// refuses; extraRule drops the repeats (here, looking for one would cost
// the square of the names).
func (s *scanner) extra(list []string, k []byte) []string {
	return append(list, decoded(k))
}

// decoded is a name as encoding/json decodes it, each byte of bad UTF-8
// a U+FFFD: two names that differ only there are one name to the oracle.
func decoded(k []byte) string {
	if utf8.Valid(k) {
		return string(k)
	}
	var b strings.Builder
	for len(k) > 0 {
		r, size := utf8.DecodeRune(k)
		b.WriteRune(r)
		k = k[size:]
	}
	return b.String()
}

// keep holds a top-level field's string value when it is the one asked
// for.
func (s *scanner) keep(field string, v []byte) {
	if s.want == field {
		s.got = decoded(v)
	}
}
