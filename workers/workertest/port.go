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
