package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestJoinStatusExitCodes proves join status exits with a code per answer:
// not armed (3) and unknown (4) are told apart from armed (0, in the dev
// test) and from each other, with the report still printed.
func TestJoinStatusExitCodes(t *testing.T) {
	dir := t.TempDir()
	r := run(t, nil, "join", "status", "--box", "b1", "--opt-dir", dir, "--identity-record", filepath.Join(dir, "identity.json"))
	if r.code != joinExitNotArmed || !strings.Contains(r.stdout, "box b1 (deployment ): no invitation") || !strings.Contains(r.stderr, "not armed (exit 3)") {
		t.Fatalf("join status with no enrollment: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	r = run(t, nil, "join", "status", "--box", "b1", "--identity-record", filepath.Join(dir, "identity.json"))
	if r.code != joinExitUnknown || !strings.Contains(r.stdout, "unknown") || !strings.Contains(r.stdout, "--opt-dir is not set") {
		t.Fatalf("join status with no --opt-dir: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if r := run(t, nil, "join", "status", "--help"); !strings.Contains(r.stdout, "Exit codes: 0 armed; 3 not armed") {
		t.Fatalf("join status --help does not document its exit codes:\n%s", r.stdout)
	}
}
