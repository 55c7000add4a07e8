// Command schemagen writes schema/validators_generated.go from the JSON
// Schemas beside it; `go generate ./schema/` runs it.
package main

import (
	"fmt"
	"os"

	"github.com/steward-dev/steward/schema/internal/gen"
)

// out is the generated file, in the schema directory go generate runs in.
const out = "validators_generated.go"

func main() {
	src, err := gen.Generate(os.DirFS("."))
	if err != nil {
		fmt.Fprintln(os.Stderr, "schemagen:", err)
		os.Exit(1)
	}
	if err := os.WriteFile(out, src, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "schemagen:", err)
		os.Exit(1)
	}
}
