package workertest_test

import (
	"fmt"
	"net"
	"sync"
	"testing"

	"github.com/steward-dev/steward/workers/workertest"
)

// TestFreePortNeverHandsOutAPortTwice asks for ports from many parallel
// tests at once, as tests starting servers do: every one must be free to
// bind, and none handed out twice. The kernel alone repeats one within 320
// draws more often than not, so without the record of what was handed out
// this fails. (The 4222 check cannot fail on a machine whose own NATS
// server holds 4222, as the kernel never offers a port in use; it guards
// only against a FreePort that hands out fixed ports.)
func TestFreePortNeverHandsOutAPortTwice(t *testing.T) {
	const tests, each = 16, 20
	var (
		mu   sync.Mutex
		seen = map[int]bool{}
	)
	t.Run("parallel", func(t *testing.T) {
		for i := range tests {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				t.Parallel()
				for range each {
					p := workertest.FreePort(t)
					mu.Lock()
					if seen[p] {
						t.Errorf("port %d handed out twice", p)
					}
					seen[p] = true
					mu.Unlock()
				}
			})
		}
	})
	if len(seen) != tests*each {
		t.Fatalf("%d distinct ports, want %d", len(seen), tests*each)
	}
	if seen[4222] {
		t.Fatal("4222 handed out; the machine's own NATS server may live there")
	}
	for p := range seen {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Fatalf("port %d was handed out but cannot be bound: %v", p, err)
		}
		l.Close()
	}
}
