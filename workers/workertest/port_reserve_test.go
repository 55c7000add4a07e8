package workertest

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// holdPortEnv makes this test binary, started as a child, the other test
// binary: it reserves the port named and holds it until its stdin closes.
const holdPortEnv = "STEWARD_TEST_HOLD_PORT"

// TestFreePortIsBelowTheEphemeralRange is the restart case: a port the
// kernel may lend to any outbound connection while a test has its server
// down is one the restarted server can find taken.
func TestFreePortIsBelowTheEphemeralRange(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Fatalf("this machine's ephemeral range: %v", err)
	}
	first, err := strconv.Atoi(strings.Fields(string(b))[0])
	if err != nil {
		t.Fatal(err)
	}
	if first-lowestReservable < 1000 {
		t.Fatalf("the ephemeral range starts at %d, too low for FreePort to keep below it; this test needs the Linux default (32768)", first)
	}
	for range 50 {
		if p := FreePort(t); p >= first || p < lowestReservable {
			t.Fatalf("FreePort gave %d, outside [%d, %d) below the ephemeral range", p, lowestReservable, first)
		}
	}
}

// TestFreePortSkipsAPortAnotherBinaryReserved runs a second test binary
// that reserves a port, as `go test ./...` runs packages side by side, and
// asks for a port where that is the only one: none is given.
func TestFreePortSkipsAPortAnotherBinaryReserved(t *testing.T) {
	if p := os.Getenv(holdPortEnv); p != "" {
		holdPort(t, p)
		return
	}
	lo, hi, ok := reservableRange()
	if !ok {
		t.Fatal("this machine's ephemeral range leaves no room below it for FreePort's range")
	}
	// A port this binary has not handed out: one it had would be refused
	// whether or not the other binary's reservation is seen.
	p := lo + rand.IntN(hi-lo)
	for ; ; p = lo + (p-lo+1)%(hi-lo) {
		taken.Lock()
		handed := taken.ports[p]
		taken.Unlock()
		if handed {
			continue
		}
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p)); err == nil {
			l.Close()
			break
		}
	}

	child := exec.Command(os.Args[0], "-test.run=^TestFreePortSkipsAPortAnotherBinaryReserved$", "-test.count=1")
	child.Env = append(os.Environ(), holdPortEnv+"="+strconv.Itoa(p))
	release, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		release.Close()
		child.Wait()
	})
	held := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		held <- line
		io.Copy(io.Discard, out)
	}()
	select {
	case line := <-held:
		if strings.TrimSpace(line) != "held" {
			t.Fatalf("the other binary did not reserve port %d: it said %q", p, line)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the other binary did not reserve port %d within 30s", p)
	}

	if got, err := reservePort(p, p+1, 20); err == nil {
		t.Fatalf("FreePort gave port %d, which another test binary holds", got)
	} else {
		t.Logf("refused as it should be: %v", err)
	}
}

// holdPort is the other binary: it reserves port p, says so, and holds
// the reservation until the parent closes its stdin.
func holdPort(t *testing.T, p string) {
	port, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reservePort(port, port+1, 1); err != nil {
		t.Fatal(err)
	}
	fmt.Println("held")
	io.Copy(io.Discard, os.Stdin)
}
