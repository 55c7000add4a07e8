package workertest_test

import (
	"os/exec"
	"testing"

	"github.com/steward-dev/steward/workers/workertest"
)

// TestGoModIsTidy fails when go.mod or go.sum is not what `go mod tidy`
// would write (a direct dependency marked // indirect, a missing or stale
// line), so the README's `go test ./...` catches it before review does.
func TestGoModIsTidy(t *testing.T) {
	gobin, err := exec.LookPath("go")
	workertest.Requires(t, "the go command on PATH", err)
	cmd := exec.Command(gobin, "mod", "tidy", "-diff")
	cmd.Dir = "../.."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go mod tidy -diff: %v; run `go mod tidy` and commit go.mod and go.sum:\n%s", err, out)
	}
}
