package schema

import (
	"bytes"
	"os"
	"testing"
	"testing/fstest"

	"github.com/steward-dev/steward/schema/internal/gen"
)

// TestGeneratedValidatorsAreCurrent fails when validators_generated.go is
// not what the generator makes of the schemas as they are now: a schema
// changed without `go generate ./schema/`, or the file edited by hand.
func TestGeneratedValidatorsAreCurrent(t *testing.T) {
	want, err := gen.Generate(files)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("validators_generated.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("validators_generated.go is not what the schemas make: run go generate ./schema/")
	}
}

// TestEverySchemaCompiles holds the oracle to every schema the generated
// code knows, so no type escapes the differential test.
func TestEverySchemaCompiles(t *testing.T) {
	oracleOnce.Do(loadOracle)
	if oracleErr != nil {
		t.Fatal(oracleErr)
	}
	if got := len(Types()); got != 6 || len(oracleSchemas) != got {
		t.Fatalf("want 6 schemas, got %d generated (%v) and %d in the oracle", got, Types(), len(oracleSchemas))
	}
	for _, typ := range Types() {
		if oracleSchemas[typ] == nil {
			t.Errorf("%s has a generated validator and no schema", typ)
		}
	}
}

// TestGeneratorRefusesWhatItCannotEnforce: a schema with a keyword the
// generator does not know fails generation rather than being validated
// less than it says.
func TestGeneratorRefusesWhatItCannotEnforce(t *testing.T) {
	for name, src := range map[string]string{
		"enum":           `{"type":"object","properties":{"a":{"type":"string","enum":["x"]}}}`,
		"format":         `{"type":"string","format":"email"}`,
		"ref":            `{"$ref":"#/$defs/x"}`,
		"two types":      `{"type":["string","null"]}`,
		"open additions": `{"type":"object","additionalProperties":{"type":"string"}}`,
	} {
		fsys := fstest.MapFS{"x.v1.json": {Data: []byte(src)}}
		if _, err := gen.Generate(fsys); err == nil {
			t.Errorf("%s: generated", name)
		}
	}
}
