package fleet

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// RunServer runs the nats-server embedded in this binary (the version
// Steward's module requires, the one the tests embed) from the config file
// conf, as `nats-server -c conf` would, until ctx ends. It is what a
// Node's process runs when no nats-server binary is given: the bench's
// binary starts itself again with a command that calls RunServer
// (Options.ServerCommand), so the server's memory and CPU are its own and
// nothing is built at run time.
func RunServer(ctx context.Context, conf string) error {
	fs := flag.NewFlagSet("nats-server", flag.ContinueOnError)
	opts, err := server.ConfigureOptions(fs, []string{"-c", conf}, server.PrintServerAndExit, fs.Usage, server.PrintTLSHelpAndDie)
	if err != nil {
		return fmt.Errorf("nats-server config %s: %w", conf, err)
	}
	// ctx ends it (the command's SIGINT and SIGTERM); a Node kills it.
	opts.NoSigs = true
	s, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("nats-server: %w", err)
	}
	s.ConfigureLogger()
	s.Start()
	<-ctx.Done()
	s.Shutdown()
	s.WaitForShutdown()
	return nil
}

// Node is one nats-server process with JetStream and its own store.
type Node struct {
	Name        string
	Port        int
	clusterPort int
	conf        string
	// command runs nats-server, given "-c <conf>" after it.
	command []string
	cmd     *exec.Cmd
	log     *bytes.Buffer
	exited  chan struct{}
}

// Servers is one server, or a cluster of them, each in its own process so
// its memory and CPU are its own.
type Servers struct {
	Nodes []*Node
}

// freePort asks the kernel for a port nothing listens on.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// StartServers starts n servers (one, or a cluster of n with routes to each
// other), each a process of command with "-c <config>" after it (a
// nats-server binary, or Options.ServerCommand), their stores and config
// under dir, and waits until JetStream answers on every one.
func StartServers(ctx context.Context, command []string, dir string, n int) (*Servers, error) {
	if len(command) == 0 {
		return nil, errors.New("no command runs nats-server: give a nats-server binary (--nats-server) or the command that runs the embedded one")
	}
	s := &Servers{}
	var routes []string
	for i := range n {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		node := &Node{Name: fmt.Sprintf("n%d", i+1), Port: p, command: command}
		if n > 1 {
			if node.clusterPort, err = freePort(); err != nil {
				return nil, err
			}
			routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", node.clusterPort))
		}
		s.Nodes = append(s.Nodes, node)
	}
	for _, node := range s.Nodes {
		store := filepath.Join(dir, node.Name)
		conf := fmt.Sprintf("server_name: %s\nlisten: 127.0.0.1:%d\njetstream {\n  store_dir: %q\n}\n", node.Name, node.Port, store)
		if n > 1 {
			conf += fmt.Sprintf("cluster {\n  name: steward-fleet\n  listen: 127.0.0.1:%d\n  routes: [%s]\n}\n", node.clusterPort, strings.Join(routes, ", "))
		}
		if err := node.startFrom(dir, []byte(conf)); err != nil {
			s.Close()
			return nil, err
		}
	}
	for _, node := range s.Nodes {
		if err := node.WaitJetStream(ctx, 60*time.Second); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// startNode starts a node of command whose configuration is conf, its
// client port port (which conf listens on), without waiting for it.
func startNode(command []string, dir, name string, port int, conf []byte) (*Node, error) {
	n := &Node{Name: name, Port: port, command: command}
	return n, n.startFrom(dir, conf)
}

// startFrom writes conf as the node's configuration file under dir and
// starts it.
func (n *Node) startFrom(dir string, conf []byte) error {
	n.conf = filepath.Join(dir, n.Name+".conf")
	if err := os.WriteFile(n.conf, conf, 0o644); err != nil {
		return err
	}
	return n.Start()
}

// Start starts the node's process (again, after Kill).
func (n *Node) Start() error {
	n.log = &bytes.Buffer{}
	n.cmd = exec.Command(n.command[0], append(n.command[1:len(n.command):len(n.command)], "-c", n.conf)...)
	n.cmd.Stdout, n.cmd.Stderr = n.log, n.log
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := n.cmd.Start(); err != nil {
		return fmt.Errorf("start nats-server %s: %w", n.Name, err)
	}
	n.exited = make(chan struct{})
	go func() { _ = n.cmd.Wait(); close(n.exited) }()
	return nil
}

// Kill ends the node's process with SIGKILL and waits until it is gone.
func (n *Node) Kill() {
	if n.cmd == nil || n.cmd.Process == nil {
		return
	}
	_ = n.cmd.Process.Kill()
	<-n.exited
}

// Pid is the node's process id, while it runs.
func (n *Node) Pid() int { return n.cmd.Process.Pid }

// URL is the node's client URL.
func (n *Node) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.Port) }

// WaitJetStream waits until the node's JetStream answers an account info.
func (n *Node) WaitJetStream(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-n.exited:
			return fmt.Errorf("nats-server %s exited: %s", n.Name, tail(n.log.String(), 2000))
		default:
		}
		nc, err := nats.Connect(n.URL(), nats.Timeout(time.Second))
		if err == nil {
			js, _ := jetstream.New(nc)
			actx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err = js.AccountInfo(actx)
			cancel()
			nc.Close()
			if err == nil {
				return nil
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("nats-server %s: JetStream not up after %v: %v", n.Name, timeout, last)
}

// RSS is the node's resident memory in bytes, from /proc.
func (n *Node) RSS() (int64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", n.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmRSS in /proc status")
}

// CPU is the CPU time (user and system) the node's process has used, from
// /proc, in clock ticks of 1/100 s (Linux's USER_HZ).
func (n *Node) CPU() (time.Duration, error) { return processCPU(n.cmd.Process.Pid) }

// processCPU is the CPU time process pid has used, as Node.CPU says.
func processCPU(pid int) (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses and may hold
	// spaces: state is field 3, utime 14 and stime 15.
	s := string(raw)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0, errors.New("short /proc stat")
	}
	ut, err1 := strconv.ParseInt(fields[11], 10, 64)
	st, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// URLs is every node's client URL, comma-separated.
func (s *Servers) URLs() string {
	var u []string
	for _, n := range s.Nodes {
		u = append(u, n.URL())
	}
	return strings.Join(u, ",")
}

// Close kills every node.
func (s *Servers) Close() {
	for _, n := range s.Nodes {
		n.Kill()
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
