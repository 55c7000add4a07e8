// Package schema holds the JSON Schema (2020-12) of every Steward event's
// data and the one validator that the publisher and the worker runtime share.
package schema

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
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
	loadOnce.Do(load)
	if loadErr != nil {
		return loadErr
	}
	sch, ok := schemas[typ]
	if !ok {
		return fmt.Errorf("%w %q: Steward knows %s", ErrUnknownType, typ, strings.Join(Types(), ", "))
	}
	if len(data) > MaxDataBytes {
		return &Error{Type: typ, Problems: []string{fmt.Sprintf("(data): %d bytes is over the limit of %d", len(data), MaxDataBytes)}}
	}
	if !json.Valid(data) {
		return &Error{Type: typ, Problems: []string{"(data): not valid JSON"}}
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return &Error{Type: typ, Problems: []string{"(data): " + err.Error()}}
	}
	err = sch.Validate(doc)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return fmt.Errorf("validate %s: %w", typ, err)
	}
	out := &Error{Type: typ}
	collect(ve, &out.Problems)
	sort.Strings(out.Problems)
	return out
}

var printer = message.NewPrinter(language.English)

// collect gathers the leaf causes: the parents only say "some child failed".
func collect(ve *jsonschema.ValidationError, into *[]string) {
	if len(ve.Causes) == 0 {
		field := "/" + strings.Join(ve.InstanceLocation, "/")
		*into = append(*into, field+": "+ve.ErrorKind.LocalizedString(printer))
		return
	}
	for _, c := range ve.Causes {
		collect(c, into)
	}
}
