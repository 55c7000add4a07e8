// Package schema holds the JSON Schema (2020-12) of every Steward event's
// data and the one validator that the publisher and the worker runtime
// share. The validators are Go, generated from the schemas
// (validators_generated.go, `go generate`): each walks the data once and
// builds no document. The JSON Schema library is their oracle in the tests
// only, which fail when the two disagree or when the generated code is not
// what the schemas make.
package schema

import (
	"embed"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
)

//go:generate go run ./internal/schemagen

//go:embed *.json
var files embed.FS

// typePrefix and typeSuffix turn a file name ("release.published.v1.json")
// into the CloudEvents type it describes ("dev.steward.release.published.v1").
const typePrefix = "dev.steward."

// Types lists the CloudEvents types that have a schema, sorted.
func Types() []string { return append([]string(nil), types...) }

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
	_, err := ValidateKey(typ, data, "")
	return err
}

// ValidateKey validates data as Validate does and returns, read in the same
// pass, the string value of its top-level field keyField (an event's key):
// "" when the field is absent or not a string, which valid data of a type
// keyed by that field never is.
func ValidateKey(typ string, data []byte, keyField string) (string, error) {
	if !slices.Contains(types, typ) {
		return "", fmt.Errorf("%w %q: Steward knows %s", ErrUnknownType, typ, strings.Join(types, ", "))
	}
	if len(data) > MaxDataBytes {
		return "", &Error{Type: typ, Problems: []string{fmt.Sprintf("(data): %d bytes is over the limit of %d", len(data), MaxDataBytes)}}
	}
	s := scanner{data: data, want: keyField}
	validate(typ, &s, &loc{root: true})
	s.end()
	s.release()
	if s.bad {
		// The parser's message may quote the data.
		return "", &Error{Type: typ, Problems: []string{"(data): not valid JSON"}}
	}
	if len(s.problems) > 0 {
		sort.Strings(s.problems)
		return "", &Error{Type: typ, Problems: s.problems}
	}
	return s.got, nil
}
