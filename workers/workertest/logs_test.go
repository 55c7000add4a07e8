package workertest_test

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/workers/workertest"
)

// TestLogsKeepsEveryLineWholeUnderConcurrentWriters logs from many
// goroutines at once, as a worker's lanes do, and reads the sink while they
// write: every line must come back whole (one JSON object) and none lost.
// Under -race an unguarded buffer fails here.
func TestLogsKeepsEveryLineWholeUnderConcurrentWriters(t *testing.T) {
	var logs workertest.Logs
	log := zerolog.New(&logs)
	const writers, each = 8, 200
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				log.Info().Int("writer", w).Int("line", i).Msg("applied")
			}
		}()
	}
	// Read until the writers are done, as a test's WaitUntil does while the
	// worker logs.
	written := make(chan struct{})
	go func() { wg.Wait(); close(written) }()
	for done := false; !done; {
		select {
		case <-written:
			done = true
		default:
			_ = logs.String()
		}
	}

	lines := strings.Split(strings.TrimSuffix(logs.String(), "\n"), "\n")
	if len(lines) != writers*each {
		t.Fatalf("%d lines, want %d", len(lines), writers*each)
	}
	seen := map[[2]int]bool{}
	for _, line := range lines {
		var l struct{ Writer, Line int }
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("a line did not come back whole: %q: %v", line, err)
		}
		seen[[2]int{l.Writer, l.Line}] = true
	}
	if len(seen) != writers*each {
		t.Fatalf("%d distinct lines, want %d", len(seen), writers*each)
	}
}
