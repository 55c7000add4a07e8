package workertest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// taken are the ports FreePort has handed out in this test binary, and
// the file whose bytes, one a port, reserve them from the other test
// binaries until this one exits.
var taken struct {
	sync.Mutex
	ports map[int]bool
	locks *os.File
}

// FreePort returns a port on 127.0.0.1 that nothing listens on, for a
// server a test starts on a port it must know first (a cluster's routes, a
// leaf node's remote, a child process's flags). It never returns the same
// port twice while a test binary runs, nor a port another test binary
// running at the same time was given, so two tests are never both given
// one to race for when they bind. It never returns 4222, where the
// machine's own NATS server may live.
//
// The port lies below the kernel's ephemeral range (on Linux,
// /proc/sys/net/ipv4/ip_local_port_range). A test that stops a server and
// starts it again on the same port, as a restart or an outage does, leaves
// the port unbound in between; inside the ephemeral range any outbound
// connection or listener on port 0 in any process may be given it then,
// and the restarted server finds its port taken (CI met this with
// PostgreSQL in TestCompose). Below the range only another FreePort picks
// it, and that one skips ports reserved in the lock file.
func FreePort(t testing.TB) int {
	t.Helper()
	lo, hi, ok := reservableRange()
	if !ok {
		return kernelPort(t)
	}
	p, err := reservePort(lo, hi, 200)
	if err != nil {
		t.Fatalf("no free port on 127.0.0.1 for the test's server: %v", err)
	}
	return p
}

// lowestReservable is where FreePort's range starts: above the ports
// services on a development machine are usually given (PostgreSQL's 5432,
// NATS's 4222 and 8222, 8080), below every kernel's ephemeral range.
const lowestReservable = 20000

// reservableRange is [lowestReservable, the start of the kernel's
// ephemeral range). It is not ok where the ephemeral range cannot be read
// or leaves fewer than a thousand ports below it, and then FreePort falls
// back to the kernel's choice.
func reservableRange() (lo, hi int, ok bool) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0, false
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return 0, 0, false
	}
	first, err := strconv.Atoi(fields[0])
	if err != nil || first-lowestReservable < 1000 {
		return 0, 0, false
	}
	return lowestReservable, first, true
}

// reservePort picks ports at random in [lo, hi) until one is neither
// handed out in this binary, reserved by another, nor bound, and reserves
// it by a lock on its byte of the lock file, held until the binary exits
// (the kernel drops a process's locks with the process, however it ends,
// and with any descriptor of the file it closes, so the file is opened
// once and never closed). The file is the user's own: tests run by
// another user reserve apart, and the bind check alone keeps them off
// each other's ports.
func reservePort(lo, hi, tries int) (int, error) {
	taken.Lock()
	defer taken.Unlock()
	if taken.ports == nil {
		taken.ports = map[int]bool{}
	}
	path := filepath.Join(os.TempDir(), fmt.Sprintf("steward-test-ports-%d.lock", os.Getuid()))
	if taken.locks == nil {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return 0, fmt.Errorf("the lock file %s that reserves ports across test binaries cannot be opened, so no port was handed out: %w; point TMPDIR at a folder this user can write", path, err)
		}
		taken.locks = f
	}
	for range tries {
		p := lo + rand.IntN(hi-lo)
		if taken.ports[p] || !lockPort(taken.locks, p) {
			continue
		}
		// Reserved from here on, even when bound by something that does
		// not take part in the reservation, so no one tries it again.
		taken.ports[p] = true
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		l.Close()
		return p, nil
	}
	return 0, fmt.Errorf("none of %d ports drawn in [%d, %d) was both unreserved and unbound (%d reserved by this binary); run fewer tests in parallel", tries, lo, hi, len(taken.ports))
}

// kernelPort is FreePort where the ephemeral range is unknown: the
// kernel's choice for a listener on port 0, never one already handed out
// in this binary.
func kernelPort(t testing.TB) int {
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
