package workertest

import (
	"net"
	"sync"
	"testing"
)

// taken are the ports FreePort has handed out in this test binary.
var taken struct {
	sync.Mutex
	ports map[int]bool
}

// FreePort returns a port on 127.0.0.1 that nothing listens on, for a
// server a test starts on a port it must know first (a cluster's routes, a
// leaf node's remote, a child process's flags). The port is only free when
// it is returned, so it never returns the same port twice in one test
// binary: two tests started in parallel are never both given one, to
// race for it when they bind. It never returns 4222, where the machine's
// own NATS server may live.
func FreePort(t testing.TB) int {
	t.Helper()
	taken.Lock()
	defer taken.Unlock()
	if taken.ports == nil {
		taken.ports = map[int]bool{}
	}
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("no port on 127.0.0.1 for the test's server: the kernel would not lend one (%v); check that the loopback interface is up and the ephemeral range not exhausted (ss -tan)", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if p != 4222 && !taken.ports[p] {
			taken.ports[p] = true
			return p
		}
	}
	t.Fatalf("no free port on 127.0.0.1 in 100 tries: the kernel offered only 4222 or ports this test binary had already handed out (%d so far); run fewer tests in parallel", len(taken.ports))
	return 0
}
