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
// leaf node's remote, a child process's flags). It never returns the same
// port twice in one test binary, so two servers started in parallel cannot
// be given one port between its release and their bind, and never 4222,
// where the machine's own NATS server may live.
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
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if p != 4222 && !taken.ports[p] {
			taken.ports[p] = true
			return p
		}
	}
	t.Fatal("no free port on 127.0.0.1 in 100 tries")
	return 0
}
