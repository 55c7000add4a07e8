// Package schema holds the JSON Schema (2020-12) of every Steward event's
// data and the one validator that the publisher and the worker runtime share.
package schema

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

//go:embed *.json
var files embed.FS

// typePrefix and typeSuffix turn a file name ("release.published.v1.json")
// into the CloudEvents type it describes ("dev.steward.release.published.v1").
const typePrefix = "dev.steward."

var (
	loadOnce sync.Once
	schemas  map[string]*jsonschema.Schema
	loadErr  error
)

func load() {
	schemas = map[string]*jsonschema.Schema{}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	names, err := fs.Glob(files, "*.json")
	if err != nil {
		loadErr = err
		return
	}
	for _, name := range names {
		raw, err := files.ReadFile(name)
		if err != nil {
			loadErr = err
			return
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
		if err != nil {
			loadErr = fmt.Errorf("schema %s: %w", name, err)
			return
		}
		if err := c.AddResource(name, doc); err != nil {
			loadErr = fmt.Errorf("schema %s: %w", name, err)
			return
		}
		sch, err := c.Compile(name)
		if err != nil {
			loadErr = fmt.Errorf("schema %s: %w", name, err)
			return
		}
		schemas[typePrefix+strings.TrimSuffix(name, ".json")] = sch
	}
}

// Types lists the CloudEvents types that have a schema, sorted.
func Types() []string {
	loadOnce.Do(load)
	out := make([]string, 0, len(schemas))
	for t := range schemas {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// Source returns the JSON text of the schema for a CloudEvents type.
func Source(typ string) ([]byte, error) {
	name, ok := strings.CutPrefix(typ, typePrefix)
	if !ok {
		return nil, fmt.Errorf("type %q has no schema", typ)
	}
	return files.ReadFile(name + ".json")
}

// ErrUnknownType is returned for a type that has no schema.
var ErrUnknownType = errors.New("unknown event type")

// Error is a data validation failure. Problems lists each one as
// "<field>: <rule>", with the field as a JSON pointer ("/given/0/node").
// No problem quotes a value of the data: a secret field that fails its
// rule is named, never shown.
type Error struct {
	Type     string
	Problems []string
}

func (e *Error) Error() string {
	return fmt.Sprintf("data of %s is invalid: %s", e.Type, strings.Join(e.Problems, "; "))
}

// MaxDataBytes bounds the data of one event; a larger one is refused before
// it is parsed.
const MaxDataBytes = 256 << 10

// Validate checks an event's data against the schema of its type. The error
// names each failing field and the rule it broke.
func Validate(typ string, data []byte) error {
	_, err := Decode(typ, data)
	return err
}

// Decode validates an event's data as Validate does and returns it decoded
// (objects as map[string]any, numbers as json.Number), so a caller that
// reads a field of valid data parses it once.
func Decode(typ string, data []byte) (any, error) {
	loadOnce.Do(load)
	if loadErr != nil {
		return nil, loadErr
	}
	sch, ok := schemas[typ]
	if !ok {
		return nil, fmt.Errorf("%w %q: Steward knows %s", ErrUnknownType, typ, strings.Join(Types(), ", "))
	}
	if len(data) > MaxDataBytes {
		return nil, &Error{Type: typ, Problems: []string{fmt.Sprintf("(data): %d bytes is over the limit of %d", len(data), MaxDataBytes)}}
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		// The parser's message may quote the data.
		return nil, &Error{Type: typ, Problems: []string{"(data): not valid JSON"}}
	}
	err = sch.Validate(doc)
	if err == nil {
		return doc, nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return nil, fmt.Errorf("validate %s: %w", typ, err)
	}
	out := &Error{Type: typ}
	collect(ve, &out.Problems)
	sort.Strings(out.Problems)
	return nil, out
}

var printer = message.NewPrinter(language.English)

// collect gathers the leaf causes: the parents only say "some child failed".
// Each is "<field>: <rule>", naming the field and the rule it broke and
// never the value: data holds secrets (a plaintext pasted where age
// ciphertext belongs), and these errors reach logs, dead letters' headers
// and JetStream's advisories.
func collect(ve *jsonschema.ValidationError, into *[]string) {
	if len(ve.Causes) == 0 {
		*into = append(*into, field(ve.InstanceLocation)+": "+rule(ve.ErrorKind))
		return
	}
	for _, c := range ve.Causes {
		collect(c, into)
	}
}

// field is the JSON pointer of a failing value. Its tokens come from the
// schema's property names and array indexes, except under objects that
// admit any key; those are bounded and escaped.
func field(loc []string) string {
	parts := make([]string, len(loc))
	for i, p := range loc {
		parts[i] = name(p)
	}
	return "/" + strings.Join(parts, "/")
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

// rule says which rule a value broke, in words that hold no part of the
// value: the library's own messages quote it ("'…' does not match
// pattern"), so every kind that carries the value is worded here, and a
// kind not known here is named by its keyword alone.
func rule(k jsonschema.ErrorKind) string {
	switch k := k.(type) {
	case *kind.Pattern:
		return "does not match pattern " + strconv.Quote(k.Want)
	case *kind.Format:
		return "is not a valid " + k.Want
	case *kind.MinLength:
		return fmt.Sprintf("is shorter than %d characters", k.Want)
	case *kind.MaxLength:
		return fmt.Sprintf("is longer than %d characters", k.Want)
	case *kind.Minimum:
		return "is below the minimum " + k.Want.RatString()
	case *kind.Maximum:
		return "is above the maximum " + k.Want.RatString()
	case *kind.ExclusiveMinimum:
		return "must be above " + k.Want.RatString()
	case *kind.ExclusiveMaximum:
		return "must be below " + k.Want.RatString()
	case *kind.MultipleOf:
		return "must be a multiple of " + k.Want.RatString()
	case *kind.AdditionalProperties:
		return "additional properties " + names(k.Properties) + " not allowed"
	case *kind.PropertyNames:
		return "invalid property name " + names([]string{k.Property})
	case *kind.InvalidJsonValue:
		return "is not a JSON value"
	case *kind.Type, *kind.Enum, *kind.Const, *kind.Required, *kind.MinItems, *kind.MaxItems,
		*kind.MinProperties, *kind.MaxProperties, *kind.UniqueItems, *kind.Contains,
		*kind.AdditionalItems, *kind.FalseSchema, *kind.DependentRequired, *kind.Dependency:
		// These name types, counts, positions and the schema's own
		// values, never the data's.
		return k.LocalizedString(printer)
	}
	if path := k.KeywordPath(); len(path) > 0 {
		return "breaks the schema's " + strconv.Quote(strings.Join(path, "/")) + " rule"
	}
	return "breaks the schema"
}
