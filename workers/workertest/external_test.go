package workertest_test

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

// TestExternalModule is issue 13's proof that a platform team can replay a
// recorded stream through one of Steward's workers from a module of its
// own: it makes a module in a temporary folder that requires Steward
// (replaced by this checkout), copies in the test of testdata/platform and
// the credential worker's recorded stream and test identity, and runs `go
// test` there. Anything the team's test needs that Steward does not export
// (an internal package, an unexported helper) fails the build, and a
// behaviour that differs from outside fails the test.
//
// It needs no network: the module's requirements are this checkout's,
// resolved from the module cache the checkout's own build filled, with
// GOPROXY=off. It builds with this test binary's -race setting, so the
// packages come from the build cache that building this test filled and
// the whole test takes seconds; it is never skipped.
func TestExternalModule(t *testing.T) {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		// Never skipped: a test binary was built by a go command.
		t.Fatalf("no go command at %s: %v", goBin, err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	modCache := strings.TrimSpace(string(output(t, root, goBin, nil, "env", "GOMODCACHE")))

	mod := t.TempDir()
	goMod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(mod, "go.mod"), platformGoMod(t, goMod, root))
	// The checkout's sums cover every requirement copied, so nothing is
	// looked up in a checksum database.
	copyFile(t, filepath.Join(root, "go.sum"), filepath.Join(mod, "go.sum"))
	copyFile(t, filepath.Join("testdata", "platform", "platform_test.go"), filepath.Join(mod, "platform_test.go"))
	// The recorded stream and its test identity are the credential
	// worker's example's, so the two replay the same stream.
	for _, name := range []string{"rotations.jsonl", "hive-1.agekey", "controller.pub"} {
		copyFile(t, filepath.Join(root, "workers", "credential", "testdata", name), filepath.Join(mod, "testdata", name))
	}

	args := []string{"test", "-count=1", "-v"}
	if raceEnabled() {
		// The packages are already built with -race for this run.
		args = append(args, "-race")
	}
	env := []string{
		"GOFLAGS=-mod=mod -buildvcs=false",
		"GOPROXY=off",
		"GOMODCACHE=" + modCache,
		"GOWORK=off",
		"GOTOOLCHAIN=local",
	}
	out := output(t, mod, goBin, env, append(args, "./...")...)
	if !bytes.Contains(out, []byte("--- PASS: TestReplayRecordedRotations")) {
		t.Fatalf("the module's test did not run:\n%s", out)
	}
}

// platformGoMod is the platform module's go.mod: the checkout's go line
// and requirements, so the same versions are built, and Steward replaced
// by the checkout.
func platformGoMod(t *testing.T, goMod []byte, root string) []byte {
	t.Helper()
	var b bytes.Buffer
	b.WriteString("module example.com/platform\n\n")
	inRequire := false
	sc := bufio.NewScanner(bytes.NewReader(goMod))
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		switch {
		case inRequire:
			b.WriteString(line + "\n")
			inRequire = !(len(f) == 1 && f[0] == ")")
		case len(f) == 2 && f[0] == "require" && f[1] == "(":
			b.WriteString("\n" + line + "\n")
			inRequire = true
		case len(f) > 0 && (f[0] == "go" || f[0] == "toolchain" || f[0] == "require"):
			b.WriteString(line + "\n")
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	b.WriteString("\nrequire github.com/steward-dev/steward v0.0.0-00010101000000-000000000000\n")
	b.WriteString("\nreplace github.com/steward-dev/steward => " + root + "\n")
	return b.Bytes()
}

// output runs the go command in dir with env over the test's own and
// fails the test, with everything it printed, when it fails.
func output(t *testing.T, dir, goBin string, env []string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
	}
	return out
}

// raceEnabled says whether this test binary was built with -race.
func raceEnabled() bool {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range info.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

func write(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	write(t, to, data)
}
