package schema

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
)

// The oracle is the JSON Schema library, which the generated validators
// replaced in production: it reads the same embedded schemas, and its
// verdict, worded as Steward words it, is what the generated code must
// say of any data.

var (
	oracleOnce    sync.Once
	oracleSchemas map[string]*jsonschema.Schema
	oracleErr     error
)

func loadOracle() {
	oracleSchemas = map[string]*jsonschema.Schema{}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	names, err := fs.Glob(files, "*.json")
	if err != nil {
		oracleErr = err
		return
	}
	for _, name := range names {
		raw, err := files.ReadFile(name)
		if err != nil {
			oracleErr = err
			return
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
		if err != nil {
			oracleErr = fmt.Errorf("schema %s: %w", name, err)
			return
		}
		if err := c.AddResource(name, doc); err != nil {
			oracleErr = fmt.Errorf("schema %s: %w", name, err)
			return
		}
		sch, err := c.Compile(name)
		if err != nil {
			oracleErr = fmt.Errorf("schema %s: %w", name, err)
			return
		}
		oracleSchemas[typePrefix+strings.TrimSuffix(name, ".json")] = sch
	}
}

// oracle validates data with the library, as schema.Validate did before
// the validators were generated.
func oracle(t testing.TB, typ string, data []byte) error {
	oracleOnce.Do(loadOracle)
	if oracleErr != nil {
		t.Fatal(oracleErr)
	}
	sch, ok := oracleSchemas[typ]
	if !ok {
		return fmt.Errorf("%w %q", ErrUnknownType, typ)
	}
	if len(data) > MaxDataBytes {
		return &Error{Type: typ, Problems: []string{fmt.Sprintf("(data): %d bytes is over the limit of %d", len(data), MaxDataBytes)}}
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return &Error{Type: typ, Problems: []string{"(data): not valid JSON"}}
	}
	err = sch.Validate(doc)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("validate %s: %v", typ, err)
	}
	out := &Error{Type: typ}
	collect(ve, &out.Problems)
	sort.Strings(out.Problems)
	return out
}

// collect gathers the leaf causes: the parents only say "some child failed".
func collect(ve *jsonschema.ValidationError, into *[]string) {
	if len(ve.Causes) == 0 {
		*into = append(*into, field(ve.InstanceLocation)+": "+rule(ve.ErrorKind))
		return
	}
	for _, c := range ve.Causes {
		collect(c, into)
	}
}

func field(loc []string) string {
	parts := make([]string, len(loc))
	for i, p := range loc {
		parts[i] = name(p)
	}
	return "/" + strings.Join(parts, "/")
}

// rule words a kind as Steward words it, never quoting the value.
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
		// The library lists them in map order; sorted, the words
		// are the same every time.
		return "additional properties " + names(slices.Sorted(slices.Values(k.Properties))) + " not allowed"
	case *kind.PropertyNames:
		return "invalid property name " + names([]string{k.Property})
	case *kind.InvalidJsonValue:
		return "is not a JSON value"
	case *kind.Type, *kind.Enum, *kind.Const, *kind.Required, *kind.MinItems, *kind.MaxItems,
		*kind.MinProperties, *kind.MaxProperties, *kind.UniqueItems, *kind.Contains,
		*kind.AdditionalItems, *kind.FalseSchema, *kind.DependentRequired, *kind.Dependency:
		return k.LocalizedString(printer)
	}
	if path := k.KeywordPath(); len(path) > 0 {
		return "breaks the schema's " + strconv.Quote(strings.Join(path, "/")) + " rule"
	}
	return "breaks the schema"
}
