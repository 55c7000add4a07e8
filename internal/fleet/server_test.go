package fleet

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMain lets the test binary be the servers' binary, as steward is for
// bench fleet: started as "<test binary> fleet-server -c <config>" it runs
// the embedded nats-server (RunServer) and nothing else.
func TestMain(m *testing.M) {
	if len(os.Args) == 4 && os.Args[1] == "fleet-server" && os.Args[2] == "-c" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		err := RunServer(ctx, os.Args[3])
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// selfServer is the command that runs this binary's embedded nats-server.
func selfServer() []string { return []string{os.Args[0], "fleet-server"} }

// TestServersRunTheEmbeddedServerInProcessesOfTheirOwn: a cluster of three
// comes up from this binary alone (no nats-server binary, no build), each
// node a process whose memory and CPU are read from /proc, and a node
// killed starts again on its store.
func TestServersRunTheEmbeddedServerInProcessesOfTheirOwn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := StartServers(ctx, selfServer(), t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := strings.Count(s.URLs(), "nats://127.0.0.1:"); got != 3 {
		t.Fatalf("URLs %q: want three nodes", s.URLs())
	}
	for _, n := range s.Nodes {
		if n.cmd.Process.Pid == os.Getpid() {
			t.Fatalf("node %s runs in the test's own process", n.Name)
		}
		if rss, err := n.RSS(); err != nil || rss <= 0 {
			t.Fatalf("node %s RSS %d, %v", n.Name, rss, err)
		}
		if _, err := n.CPU(); err != nil {
			t.Fatalf("node %s CPU: %v", n.Name, err)
		}
	}
	n := s.Nodes[0]
	n.Kill()
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	if err := n.WaitJetStream(ctx, time.Minute); err != nil {
		t.Fatalf("after a restart: %v", err)
	}
}

// TestAServerThatCannotStartSaysWhy: a config the server refuses ends its
// process, and the wait says so with the server's own words.
func TestAServerThatCannotStartSaysWhy(t *testing.T) {
	dir := t.TempDir()
	conf := dir + "/bad.conf"
	if err := os.WriteFile(conf, []byte("listen: 127.0.0.1:notaport\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n := &Node{Name: "bad", Port: 1, conf: conf, command: selfServer()}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	defer n.Kill()
	err := n.WaitJetStream(context.Background(), 30*time.Second)
	if err == nil || !strings.Contains(err.Error(), "nats-server bad exited") || !strings.Contains(err.Error(), "bad.conf") {
		t.Fatalf("got %v; want the exit and the config named", err)
	}
	if _, err := StartServers(context.Background(), nil, dir, 1); err == nil || !strings.Contains(err.Error(), "--nats-server") {
		t.Fatalf("no command: %v", err)
	}
}
