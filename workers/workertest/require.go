package workertest

import (
	"os"
	"testing"
)

// Requires stops the test when something it needs from the machine is
// missing (err is why): a skip on a developer's machine, but a failure
// under CI (CI set in the environment), where .ci/run installs everything
// the tests need, so a skip there would pass a test that never ran.
func Requires(t testing.TB, what string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("CI must provide %s: %v", what, err)
	}
	t.Skipf("needs %s: %v", what, err)
}
