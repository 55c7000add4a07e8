package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/internal/fleet"
)

// childEnv, set, makes the test binary an external path's program: "ok"
// runs testConsumer, "fail" one that cannot start.
const childEnv = "STEWARD_BENCH_TEST_CHILD"

func TestMain(m *testing.M) {
	// StartProcess's server: this binary again, as `steward bench` runs
	// itself.
	if len(os.Args) == 4 && os.Args[1] == "fleet-server" && os.Args[2] == "-c" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		err := fleet.RunServer(ctx, os.Args[3])
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(ExternalMain(context.Background(), os.Args[1:], os.Stdout, os.Stderr, "test child", testConsumer(mode)))
	}
	os.Exit(m.Run())
}

// testChild is the test binary started again as an external path's
// program, in mode ("" for "ok").
func testChild(t *testing.T, mode string) *External {
	if mode == "" {
		mode = "ok"
	}
	t.Setenv(childEnv, mode)
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return &External{Name: "test child", Command: []string{bin}}
}

// testConsumer is a serial DoubleAck consumer made through nats.go alone,
// on a connection of its own, as an external library's would be; in mode
// "fail" it cannot start.
func testConsumer(mode string) Consumer {
	return func(ctx context.Context, url, stream string, marks Marks) (func() error, error) {
		if mode == "fail" {
			return nil, errors.New("the test child was told to fail")
		}
		nc, err := nats.Connect(url)
		if err != nil {
			return nil, err
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return nil, err
		}
		cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "test-child", AckPolicy: jetstream.AckExplicitPolicy})
		if err != nil {
			nc.Close()
			return nil, err
		}
		cc, err := cons.Consume(func(m jetstream.Msg) {
			id := m.Headers().Get(idHeader)
			marks.Handled(id)
			if m.DoubleAck(ctx) == nil {
				marks.Settled(id)
			}
		})
		if err != nil {
			nc.Close()
			return nil, err
		}
		return func() error {
			defer nc.Close()
			cc.Stop()
			return js.DeleteConsumer(context.Background(), stream, "test-child")
		}, nil
	}
}

// TestExternalPathThatFailsSaysWhy proves a run whose external program
// fails stops with the path's name and what the program said.
func TestExternalPathThatFailsSaysWhy(t *testing.T) {
	_, err := Run(context.Background(), Options{Events: 50, Keys: 4, Timeout: time.Minute, External: testChild(t, "fail")})
	if err == nil || !strings.Contains(err.Error(), "test child, round 1") || !strings.Contains(err.Error(), "the test child was told to fail") {
		t.Fatalf("a failing external program: %v", err)
	}
}

// TestExternalMainAlone proves an external path's program run by hand
// against a server prints its measure as a line of the report.
func TestExternalMainAlone(t *testing.T) {
	env, err := Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	var stdout, stderr bytes.Buffer
	code := ExternalMain(context.Background(), []string{"--url", env.URL(), "--events", "40", "--keys", "4", "--warm-up", "10"},
		&stdout, &stderr, "by hand", testConsumer("ok"))
	if code != 0 || !strings.HasPrefix(stdout.String(), "by hand ") || !strings.Contains(stdout.String(), "40 events in") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
	stdout.Reset()
	if code := ExternalMain(context.Background(), []string{"--events", "40"}, &stdout, &stderr, "by hand", testConsumer("ok")); code != 2 ||
		!strings.Contains(stderr.String(), "--url: required") {
		t.Fatalf("without --url: exit %d, stderr %q", code, stderr.String())
	}
}

// TestReadExternal proves the bench takes an external program's measure
// only whole and in order, adds its own CPU to the program's, and gives as
// the server's part what its server process used, whatever the program
// said.
func TestReadExternal(t *testing.T) {
	none := func(int, int) {}
	var progressed []int
	// This process and the server read 8 µs more at the measure than at
	// the "measuring" line, 4 µs of it the server's: 1 µs and 0.5 µs for
	// each of the 8 events.
	var read cpuUse
	cpuNow := func() cpuUse {
		read.all += 8 * time.Microsecond
		read.server += 4 * time.Microsecond
		return read
	}
	m, err := readExternal(strings.NewReader("something else\nmeasuring\nprogress 3 8\nmeasure {\"Events\":8,\"PerSecond\":5,\"CPU\":1000,\"ServerCPU\":77}\n"), 8,
		cpuNow, func(settled, total int) { progressed = append(progressed, settled, total) })
	if err != nil || m.Events != 8 || m.PerSecond != 5 || m.CPU != 1000+time.Microsecond || m.ServerCPU != 500 || len(progressed) != 2 || progressed[0] != 3 {
		t.Fatalf("%+v, %v, progress %v", m, err, progressed)
	}
	for input, want := range map[string]string{
		"measure {\"Events\":8}\n":                "came before its \"measuring\" line",
		"measuring\nmeasure {\"Events\":7}\n":     "of 7 events, want 8",
		"measuring\nmeasure {\"Events\":\n":       "its measure",
		"measuring\nprogress 1 8\n":               "printed no measure",
		"measuring\nmeasure {\"Events\":\"8\"}\n": "its measure",
	} {
		if _, err := readExternal(strings.NewReader(input), 8, cpuNow, none); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error saying %q", input, err, want)
		}
	}
}

// TestExternalCommand proves an external path's program is taken as it is
// when it is a file, built with `go build` when it is a folder, and refused,
// named, when it is neither or does not build.
func TestExternalCommand(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("no go command: %v", err)
	}
	ctx := context.Background()
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if cmd, err := ExternalCommand(ctx, bin, t.TempDir()); err != nil || len(cmd) != 1 || cmd[0] != bin {
		t.Fatalf("a file: %v, %v", cmd, err)
	}
	if _, err := ExternalCommand(ctx, "no/such/program", t.TempDir()); err == nil || !strings.Contains(err.Error(), "no/such/program") {
		t.Fatalf("a missing path: %v", err)
	}
	src := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(src, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/external\n\ngo 1.22\n")
	write("main.go", "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Print(\"built\") }\n")
	cmd, err := ExternalCommand(ctx, src, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(cmd[0]).Output()
	if err != nil || string(out) != "built" {
		t.Fatalf("the built program: %q, %v", out, err)
	}
	write("main.go", "package main\n\nfunc main() { undefined() }\n")
	if _, err := ExternalCommand(ctx, src, t.TempDir()); err == nil || !strings.Contains(err.Error(), "go build in "+src) || !strings.Contains(err.Error(), "undefined") {
		t.Fatalf("a folder that does not build: %v", err)
	}
}
