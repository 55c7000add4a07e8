package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOpenDropsTheLineAKillCutShort: a kill inside the last line's write
// leaves it cut short; the next process drops it (its event is logged
// again on redelivery) and starts, where it used to refuse to. A broken
// line before the last is not a kill's doing, and is still refused.
func TestOpenDropsTheLineAKillCutShort(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, LogFile)
	whole := `{"hive":"h1","version":1,"seq":7,"eventId":"e7","prev":0,"pid":1,"at":1}` + "\n"
	if err := os.WriteFile(path, []byte(whole+`{"hive":"h4`), 0o644); err != nil {
		t.Fatal(err)
	}
	h, err := open(dir, 0)
	if err != nil {
		t.Fatalf("open with a last line cut short: %v", err)
	}
	h.log.Close()
	if !h.logged[7] || len(h.logged) != 1 {
		t.Errorf("logged %v, want sequence 7 only", h.logged)
	}
	if raw, _ := os.ReadFile(path); string(raw) != whole {
		t.Errorf("the log holds %q after open, want the cut line dropped: %q", raw, whole)
	}

	if err := os.WriteFile(path, []byte(`{"hive":"h4`+"\n"+whole), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := open(dir, 0); err == nil || !strings.Contains(err.Error(), "broken line") {
		t.Fatalf("open with a broken line before the last: %v, want it refused", err)
	}
}
