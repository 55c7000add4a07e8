package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/workers/converge"
	"github.com/steward-dev/steward/workers/credential"
	"github.com/steward-dev/steward/workers/join"
	"github.com/steward-dev/steward/workers/provision"
	"github.com/steward-dev/steward/workers/workertest"
)

// natsCLI is the nats CLI's path: on PATH, else where go install puts it.
// Missing, the test stops through workertest.Requires (.ci/run installs
// it).
func natsCLI(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("nats"); err == nil {
		return p
	}
	out, err := exec.Command("go", "env", "GOPATH").Output()
	if err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), "bin", "nats")
		if _, err = os.Stat(p); err == nil {
			return p
		}
	}
	workertest.Requires(t, "the nats CLI (go install github.com/nats-io/natscli/nats@v0.2.4)", err)
	return ""
}

// devCommandStarts are how the commands dev prints begin; a command is a
// line, or the part of a line after its "label: ", that starts so.
var devCommandStarts = []string{"go run ./cmd/steward ", "nats ", "curl ", "psql ", "PGPASSWORD=", "export "}

// devLabel is a line's "what it is: " before a command.
var devLabel = regexp.MustCompile(`^[^:]*:\s+`)

// printedCommands are the command lines among dev's output, in order, as a
// person pastes them: without their trailing "   # comment".
func printedCommands(lines []string) []string {
	var out []string
	for _, l := range lines {
		l, _, _ = strings.Cut(l, "   # ")
		l = strings.TrimSpace(l)
		for _, c := range []string{l, devLabel.ReplaceAllString(l, "")} {
			if slices.ContainsFunc(devCommandStarts, func(p string) bool { return strings.HasPrefix(c, p) }) {
				out = append(out, c)
				break
			}
		}
	}
	return out
}

// devShell runs one printed command as a shell runs it pasted: steward's
// binary for go run ./cmd/steward, the real nats CLI, curl and psql.
type devShell struct {
	env []string
}

func (s devShell) run(t *testing.T, line string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", strings.ReplaceAll(line, "go run ./cmd/steward", bin))
	cmd.Env = s.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("dev's printed %q: %v\n%s", line, err, out)
	}
	return string(out)
}

// convergedTo is the versions converge-dev's succeeded outcomes moved to,
// in order, failing the test on any other outcome.
func convergedTo(t *testing.T, js jetstream.JetStream) []string {
	t.Helper()
	var to []string
	for _, o := range workertest.Outcomes(t, js, converge.Name, converge.DevInstall) {
		if o.Type() != "dev.steward.converge.succeeded.v1" {
			t.Fatalf("converge-dev: outcome %s %s, want every release applied", o.Type(), o.Data())
		}
		var s converge.Succeeded
		if err := json.Unmarshal(o.Data(), &s); err != nil {
			t.Fatal(err)
		}
		to = append(to, s.To)
	}
	return to
}

// TestDevPrintedLines runs every command line `steward dev` prints, as
// printed and in order (steward's binary standing in for go run
// ./cmd/steward, the real nats CLI, curl and psql), with nothing exported
// first: each works pasted on its own, credentials included. The releases
// they publish are in dev's registry, signed, and each applies; the
// credential, join and provision lines apply too; status and dlq ls
// answer. Restarted, dev reads the install's version from the bucket
// (never "first start" again) and its new lines converge above it.
func TestDevPrintedLines(t *testing.T) {
	cli := natsCLI(t)
	dir := reachableDir(t)
	stopLeftPostgres(t, filepath.Join(dir, "postgres"))
	// Its own contexts: dev writes steward-dev-operator and
	// steward-dev-publisher there, and the printed lines read them.
	env := []string{"XDG_CONFIG_HOME=" + t.TempDir(), "PATH=" + filepath.Dir(cli) + string(os.PathListSeparator) + os.Getenv("PATH")}
	sh := devShell{env: cleanEnv(env...)}
	d := startDevWith(t, env, dir)
	_, js := connectCreds(t, d.natsURL, d.operatorCreds)

	lines := d.p.snapshot()
	cmds := printedCommands(lines)
	for _, want := range []string{"export ", "nats --server ", "nats --context ", "curl ", "go run ./cmd/steward --context steward-dev-operator status", "go run ./cmd/steward --context steward-dev-operator dlq ls"} {
		if !slices.ContainsFunc(cmds, func(c string) bool { return strings.HasPrefix(c, want) }) {
			t.Fatalf("no printed command starts %q among %q\n%s", want, cmds, strings.Join(lines, "\n"))
		}
	}
	grantApplied := func() bool {
		for _, o := range workertest.Outcomes(t, js, provision.Name, provision.DevMachine) {
			if o.Type() == "dev.steward.grant.applied.v1" {
				return true
			}
		}
		return false
	}
	for _, c := range cmds {
		if strings.HasPrefix(c, "PGPASSWORD=") {
			// "then connect" follows the grant its role comes from.
			workertest.WaitUntil(t, "provision applies the printed grant", grantApplied)
		}
		out := sh.run(t, c)
		t.Logf("ran %.100s", c)
		switch {
		case strings.Contains(c, " stream ls"):
			if !strings.Contains(out, "STEWARD_EVENTS") {
				t.Fatalf("%q lists no STEWARD_EVENTS:\n%s", c, out)
			}
		case strings.HasSuffix(c, " status"):
			if !strings.Contains(out, "converge-dev") {
				t.Fatalf("%q shows no converge-dev:\n%s", c, out)
			}
		case strings.HasSuffix(c, " dlq ls"):
			if strings.TrimSpace(out) == "" {
				t.Fatalf("%q answered nothing", c)
			}
		}
	}

	// Two converge lines and three ways to publish: five releases, each
	// applied, none refused.
	first := []string{"1.1.0", "1.2.0", "1.3.0", "1.4.0", "1.5.0"}
	workertest.WaitUntil(t, "the five printed releases converge", func() bool { return len(convergedTo(t, js)) == len(first) })
	if got := convergedTo(t, js); !slices.Equal(got, first) {
		t.Fatalf("converged to %v, want %v", got, first)
	}
	if dls := workertest.DeadLetters(t, js, converge.Name, converge.DevInstall); len(dls) != 0 {
		t.Fatalf("dead letters %+v: every printed release is valid", dls)
	}
	for _, w := range []struct{ name, instance, event, outcome string }{
		{credential.Name, credential.DevHive, "credential.rotated", "dev.steward.credential.applied.v1"},
		{join.Name, join.DevBox, "invitation.written", "dev.steward.join.armed.v1"},
		{provision.Name, provision.DevMachine, "grant.changed", "dev.steward.grant.applied.v1"},
	} {
		if !slices.ContainsFunc(cmds, func(c string) bool { return strings.Contains(c, w.event) }) {
			continue // not running here: provision without PostgreSQL
		}
		workertest.WaitUntil(t, w.name+" applies its printed event", func() bool {
			for _, o := range workertest.Outcomes(t, js, w.name, w.instance) {
				if o.Type() == w.outcome {
					return true
				}
			}
			return false
		})
	}
	for _, v := range append(first, "1.6.0") {
		if _, err := os.Stat(filepath.Join(dir, "registry", v, converge.BundleFile)); err != nil {
			t.Fatalf("release %s is not signed in dev's registry: %v", v, err)
		}
	}

	// Restarted: the banner says the install is at 1.5.0, from its
	// document, and the lines go on from there.
	if code := d.p.stop(t, syscall.SIGINT); code != 0 {
		t.Fatalf("dev exited %d after SIGINT", code)
	}
	d2 := startDevWith(t, env, dir)
	_, js2 := connectCreds(t, d2.natsURL, d2.operatorCreds)
	banner := d2.p.waitLine(t, `converge: install "dev" at `)
	if !strings.Contains(banner, `at 1.5.0 (recorded in st.converge.dev.installed, signed by converge-dev, by event rel-1.5.0`) {
		t.Fatalf("after a restart the converge line reads %q, want 1.5.0 from its document", banner)
	}
	var again []string
	for _, c := range printedCommands(d2.p.snapshot()) {
		if strings.Contains(c, "release.published") {
			sh.run(t, c)
			again = append(again, c)
		}
	}
	if len(again) != 5 {
		t.Fatalf("after a restart dev printed %d ways to publish a release, want 5: %q", len(again), again)
	}
	all := append(first, "1.6.0", "1.7.0", "1.8.0", "1.9.0", "1.10.0")
	workertest.WaitUntil(t, "the releases printed after the restart converge", func() bool { return len(convergedTo(t, js2)) == len(all) })
	if got := convergedTo(t, js2); !slices.Equal(got, all) {
		t.Fatalf("converged to %v, want %v", got, all)
	}
	if code := d2.p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("dev exited %d after SIGTERM", code)
	}
}
