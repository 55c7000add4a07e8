package resident_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/steward-dev/steward/internal/atomicfile"
	"github.com/steward-dev/steward/internal/resident"
)

// childEnv marks the process TestTrimPagesOutTheBinary starts to trim.
const childEnv = "RESIDENT_TRIM_CHILD"

// TestTrimPagesOutTheBinary runs this test binary again from a copy of
// its own (pages of a file another process maps stay resident, and the
// process trimmed must start fresh, as a worker does, not after an
// earlier trim): there, what init paged in of the binary shrinks.
func TestTrimPagesOutTheBinary(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		before := rssFile(t)
		if err := resident.Trim(); err != nil {
			t.Fatal(err)
		}
		after := rssFile(t)
		// How much goes depends on what the kernel holds in large folios
		// and what the test touches again at once (a worker's 28.5 MB went
		// to 4.2); that some goes says the binary's mappings were found
		// and the kernel took the advice.
		if after >= before {
			t.Fatalf("file-backed resident memory %d kB after Trim, from %d: want less", after, before)
		}
		t.Logf("file-backed resident memory %d kB before Trim, %d after", before, after)
		return
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	// Written whole and synced, as an installed binary is: the kernel
	// pages out only clean pages.
	own := filepath.Join(t.TempDir(), "resident.test")
	if err := atomicfile.Write(own, raw, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(own, "-test.run=^TestTrimPagesOutTheBinary$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestTrimPagesOutTheBinary") {
		t.Fatalf("the trimmed process: %v\n%s", err, out)
	}
	t.Logf("the trimmed process:\n%s", out)
}

// rssFile is this process's file-backed resident memory, in kB.
func rssFile(t *testing.T) int {
	t.Helper()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "RssFile:"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				t.Fatal(err)
			}
			return kb
		}
	}
	t.Fatal("no RssFile in /proc/self/status")
	return 0
}
