package main

import (
	"strconv"
	"strings"
	"testing"
)

// bench memory measures dev's two starts and a worker, with the Go heap
// from their /metrics, and says which target each meets.
func TestBenchMemoryReportsDevAndAWorker(t *testing.T) {
	r := ok(t, nil, "bench", "memory", "--settle", "0s", "--dev-target", "100000", "--worker-target", "0.001")
	rows := map[string]string{}
	for _, l := range strings.Split(r.stdout, "\n") {
		for _, name := range []string{"dev, first start", "dev, warm start", "worker credential, alone"} {
			if strings.HasPrefix(l, name) {
				rows[name] = l
			}
		}
	}
	for name, want := range map[string]string{"dev, first start": "met", "dev, warm start": "met", "worker credential, alone": "missed by"} {
		row, found := rows[name]
		if !found {
			t.Fatalf("no row %q in:\n%s\nstderr:\n%s", name, r.stdout, r.stderr)
		}
		fields := strings.Fields(strings.TrimPrefix(row, name))
		// resident, anonymous, file-backed, proportional, heap in use, heap kept, ≤, target, verdict...
		if len(fields) < 9 || fields[4] == "-" || !strings.Contains(row, want) {
			t.Fatalf("row %q: want the heap from /metrics and %q:\n%s", name, want, r.stdout)
		}
		if pss, err := strconv.ParseFloat(fields[3], 64); err != nil || pss <= 0 {
			t.Fatalf("row %q: proportional memory %q, want a figure above 0 from smaps_rollup:\n%s", name, fields[3], r.stdout)
		}
	}
}
