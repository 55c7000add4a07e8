package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// External is a path measured by a program of its own, whose main is
// ExternalMain, started once a turn against the bench's server. The
// Watermill path is one (internal/bench/watermill): a module of its own, so
// that the product does not depend on Watermill, and still a line of the
// same report, measured in the same run on the same server.
type External struct {
	// Name names the path in the report.
	Name string
	// Command is the program and any arguments of its own; the bench adds
	// ExternalMain's flags.
	Command []string
}

// Consumer starts an external path's consumer: it reads stream on the
// server at url as its library does, calling marks.Handled when an event
// reaches the handler and marks.Settled once its ack is confirmed, until
// stop is called. stop also removes what the consumer created on the
// server.
type Consumer func(ctx context.Context, url, stream string, marks Marks) (stop func() error, err error)

// The lines of an external path's program that the bench reads (with
// --report): the first event of the measured turn is about to go out, how
// many events are settled, and the measure.
const (
	lineMeasuring = "measuring"
	lineProgress  = "progress "
	lineMeasure   = "measure "
)

// ExternalMain is the main of an external path's program: it measures
// consumer c, named name, against the server at --url as Raw measures its
// consumers (the same events, published the same way, to the plain
// stream), after an unmeasured turn of --warm-up events, and prints the
// measure as a report line, or for the bench that started it (--report) as
// lines the bench reads. It returns the process's exit status.
func ExternalMain(ctx context.Context, args []string, stdout, stderr io.Writer, name string, c Consumer) int {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "", "the JetStream server's client URL (required)")
	var o Options
	fs.IntVar(&o.Events, "events", DefaultEvents, "events published and consumed")
	fs.IntVar(&o.Keys, "keys", 64, "distinct keys the events spread over")
	fs.IntVar(&o.Rate, "rate", 0, "publish at this many events per second instead of one burst")
	fs.DurationVar(&o.Timeout, "timeout", 5*time.Minute, "give up on a turn after this long")
	warmUp := fs.Int("warm-up", warmUpEvents, "events of the unmeasured turn first (0: none)")
	report := fs.Bool("report", false, "print the lines `steward bench` reads instead of a report line")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *url == "" {
		fmt.Fprintln(stderr, "--url: required (the JetStream server's client URL)")
		return 2
	}
	if o.Events < 1 || o.Keys < 1 || o.Rate < 0 || *warmUp < 0 {
		fmt.Fprintf(stderr, "--events %d, --keys %d, --rate %d, --warm-up %d: want at least 1 event and 1 key, no negative rate or warm-up\n",
			o.Events, o.Keys, o.Rate, *warmUp)
		return 2
	}
	if err := runExternal(ctx, *url, name, c, o, *warmUp, *report, stdout); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	return 0
}

func runExternal(ctx context.Context, url, name string, c Consumer, o Options, warmUp int, report bool, stdout io.Writer) error {
	env, err := Dial(ctx, url)
	if err != nil {
		return err
	}
	defer env.Close()
	if warmUp > 0 {
		warm := o
		warm.Events, warm.Rate = warmUp, 0
		if _, err := env.consumeWith(ctx, warm, name, c); err != nil {
			return fmt.Errorf("warming up: %w", err)
		}
	}
	if report {
		o.measuring = func() { fmt.Fprintln(stdout, lineMeasuring) }
		o.Progress = func(_ string, settled, total int) { fmt.Fprintf(stdout, "%s%d %d\n", lineProgress, settled, total) }
	}
	m, err := env.consumeWith(ctx, o, name, c)
	if err != nil {
		return err
	}
	if !report {
		_, err := fmt.Fprint(stdout, m.Line(name))
		return err
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s%s\n", lineMeasure, b)
	return err
}

// consumeWith is one turn of consumer c on the plain stream.
func (e *Env) consumeWith(ctx context.Context, o Options, name string, c Consumer) (Measure, error) {
	var stopped error
	m, err := e.consume(ctx, o, name, Plain.stream(), Plain.reshape, func(ctx context.Context, t *tracker) (func(), error) {
		stop, err := c(ctx, e.url, Plain.stream(), Marks{t})
		if err != nil {
			return nil, err
		}
		return func() { stopped = stop() }, nil
	})
	if err == nil && stopped != nil {
		err = fmt.Errorf("stopping the consumer: %w", stopped)
	}
	return m, err
}

// External runs o.External's program for one turn against this server and
// returns its measure, its CPU per event being the program's and this
// process's (the server's) over the measured stretch.
func (e *Env) External(ctx context.Context, o Options) (Measure, error) {
	o = o.withDefaults()
	x := o.External
	if x == nil || len(x.Command) == 0 {
		return Measure{}, errors.New("external path: no program to run")
	}
	// The program has o.Timeout for each of its two turns, the warm-up and
	// the measured one; a minute more lets it say why it gave up.
	ctx, cancel := context.WithTimeout(ctx, 2*o.Timeout+time.Minute)
	defer cancel()
	args := append(append([]string(nil), x.Command[1:]...),
		"--url", e.URL(), "--events", strconv.Itoa(o.Events), "--keys", strconv.Itoa(o.Keys),
		"--rate", strconv.Itoa(o.Rate), "--timeout", o.Timeout.String(),
		"--warm-up", strconv.Itoa(min(warmUpEvents, o.Events)), "--report")
	cmd := exec.CommandContext(ctx, x.Command[0], args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return Measure{}, err
	}
	if err := cmd.Start(); err != nil {
		return Measure{}, fmt.Errorf("start %s: %w", x.Command[0], err)
	}
	m, readErr := readExternal(out, o.Events, e.cpu, func(settled, total int) {
		if o.Progress != nil {
			o.Progress(x.Name, settled, total)
		}
	})
	// Whatever the program printed is read; what it says when it fails is
	// on its standard error.
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		return Measure{}, fmt.Errorf("%s: %w: %s", x.Command[0], err, strings.TrimSpace(stderr.String()))
	}
	if readErr != nil {
		return Measure{}, fmt.Errorf("%s: %w", x.Command[0], readErr)
	}
	return m, nil
}

// readExternal reads the lines of an external path's program until its
// measure, and adds to its CPU per event the server's (cpuNow, this
// process's and its server process's) from the program's "measuring" line
// to its measure; its ServerCPU is the server process's alone.
func readExternal(r io.Reader, events int, cpuNow func() cpuUse, progress func(settled, total int)) (Measure, error) {
	var started bool
	var cpu cpuUse
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == lineMeasuring:
			started, cpu = true, cpuNow()
		case strings.HasPrefix(line, lineProgress):
			var settled, total int
			if _, err := fmt.Sscan(strings.TrimPrefix(line, lineProgress), &settled, &total); err == nil {
				progress(settled, total)
			}
		case strings.HasPrefix(line, lineMeasure):
			if !started {
				return Measure{}, fmt.Errorf("its measure came before its %q line: this process's CPU cannot be counted", lineMeasuring)
			}
			used := cpuNow().since(cpu)
			var m Measure
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, lineMeasure)), &m); err != nil {
				return Measure{}, fmt.Errorf("its measure %q: %w", line, err)
			}
			if m.Events != events {
				return Measure{}, fmt.Errorf("its measure is of %d events, want %d", m.Events, events)
			}
			m.CPU += used.all / time.Duration(m.Events)
			m.ServerCPU = used.server / time.Duration(m.Events)
			return m, nil
		}
	}
	if err := sc.Err(); err != nil {
		return Measure{}, err
	}
	return Measure{}, errors.New("it printed no measure")
}

// ExternalCommand is the command of an external path's program at path: path
// itself if it is a file; if it is a folder, the program `go build` makes
// from it, put in dir.
func ExternalCommand(ctx context.Context, path, dir string) ([]string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("external path's program %s: %w", path, err)
	}
	if !fi.IsDir() {
		return []string{path}, nil
	}
	bin := filepath.Join(dir, filepath.Base(filepath.Clean(path)))
	if !filepath.IsAbs(bin) {
		if bin, err = filepath.Abs(bin); err != nil {
			return nil, err
		}
	}
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	build.Dir = path
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build in %s: %w: %s", path, err, strings.TrimSpace(string(out)))
	}
	return []string{bin}, nil
}
