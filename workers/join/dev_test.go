package join_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers/join"
	"github.com/steward-dev/steward/workers/workertest"
)

// TestDev prepares the development box twice (the second run reuses and
// rewrites the same bytes), then publishes its sample data files as the
// printed lines say and sees the stand-in arm command arm the box.
func TestDev(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	cfg, lines, err := join.Dev(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(dir, "join")
	snapshot := map[string]string{}
	for _, name := range []string{"console.key", "console.pub", "release.key", "release.pub", "identity.json", "instance-id", "arm.sh", "invitation.json", "hostfloor.json"} {
		snapshot[name] = string(readFile(t, filepath.Join(base, name)))
	}
	cfg2, lines2, err := join.Dev(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	if cfg2 != cfg || !slices.Equal(lines, lines2) {
		t.Fatal("a second Dev run changed the config or the lines")
	}
	for name, before := range snapshot {
		if string(readFile(t, filepath.Join(base, name))) != before {
			t.Errorf("a second Dev run changed %s", name)
		}
	}
	for name, want := range map[string]os.FileMode{"console.key": 0o600, "release.key": 0o600, "arm.sh": 0o755} {
		fi, err := os.Stat(filepath.Join(base, name))
		if err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v (%v), want %v", name, fi.Mode().Perm(), err, want)
		}
	}
	text := strings.Join(lines, "\n")
	t.Logf("Dev prints:\n%s", text)
	floorLine := "go run ./cmd/steward publish --type " + events.TypeHostFloorPublished + " --data @" + filepath.Join(base, "hostfloor.json")
	invLine := "go run ./cmd/steward publish --type " + events.TypeInvitationWritten + " --data @" + filepath.Join(base, "invitation.json")
	if !strings.Contains(text, floorLine) || !strings.Contains(text, invLine) || strings.Index(text, floorLine) > strings.Index(text, invLine) {
		t.Fatalf("lines do not say to publish the floor, then the invitation:\n%s", text)
	}
	if rep := join.Status(ctx, cfg); rep.Stage != join.StageNoInvitation {
		t.Fatalf("fresh dev box: %s", rep)
	}

	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	w, err := join.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := workertest.Start(t, js, w.Spec(), w)
	workertest.PublishData(t, js, events.TypeHostFloorPublished, join.DevDeployment, readFile(t, filepath.Join(base, "hostfloor.json")))
	workertest.PublishData(t, js, events.TypeInvitationWritten, join.DevBox, readFile(t, filepath.Join(base, "invitation.json")))
	armed := waitOutcomes(t, js, join.DevBox, join.OutcomeArmed, 1)
	workertest.WaitIdle(t, js, r.ConsumerName())
	if armed[0]["enrollment"] != join.DevEnrollment {
		t.Fatalf("armed %v", armed[0])
	}
	if rep := join.Status(ctx, cfg); rep.Stage != join.StageArmed {
		t.Fatalf("dev box after the samples: %s", rep)
	}
	if dls := workertest.DeadLetters(t, js, join.Name, join.DevBox); len(dls) != 0 {
		t.Fatalf("dead letter %q", dls[0].Reason)
	}
}

// TestNewChecksConfig refuses each bad setting with its flag's name.
func TestNewChecksConfig(t *testing.T) {
	f := newFixture(t, "box-c")
	if _, err := join.New(f.cfg); err != nil {
		t.Fatalf("a good config: %v", err)
	}
	if err := signing.GenerateKeyPair(signing.P256, f.path("p256.key"), f.path("p256.pub")); err != nil {
		t.Fatal(err)
	}
	f.write("not-exec", "#!/bin/sh\n", 0o644)
	cases := []struct {
		change func(c *join.Config)
		flag   string
	}{
		{func(c *join.Config) { c.Box = "" }, "--box"},
		{func(c *join.Config) { c.Box = "box.1" }, "--box"},
		{func(c *join.Config) { c.Deployment = "dep/1" }, "--deployment"},
		{func(c *join.Config) { c.ConsoleKey = "" }, "--console-key"},
		{func(c *join.Config) { c.ConsoleKey = f.path("missing.pub") }, "--console-key"},
		{func(c *join.Config) { c.ConsoleKey = f.path("console.key") }, "--console-key"},
		{func(c *join.Config) { c.ReleaseKey = f.path("p256.pub") }, "--release-key"},
		{func(c *join.Config) { c.IdentityRecord = "" }, "--identity-record"},
		{func(c *join.Config) { c.InstanceIDFile = "" }, "--instance-id-file or --instance-id-url"},
		{func(c *join.Config) { c.InstanceIDURL = "http://169.254.169.254/id" }, "--instance-id-file and --instance-id-url"},
		{func(c *join.Config) { c.InstanceIDFile, c.InstanceIDURL = "", "file:///etc/hostname" }, "--instance-id-url"},
		{func(c *join.Config) { c.OptDir = "opt" }, "--opt-dir"},
		{func(c *join.Config) { c.ArmCommand = "" }, "--arm-command"},
		{func(c *join.Config) { c.ArmCommand = f.path("not-exec") }, "--arm-command"},
		{func(c *join.Config) { c.ArmedMarker = "" }, "--armed-marker"},
		{func(c *join.Config) { c.MaxClockSkew = -time.Second }, "--max-clock-skew"},
		{func(c *join.Config) { c.ArmTimeout = -time.Second }, "--arm-timeout"},
	}
	for i, c := range cases {
		cfg := f.cfg
		c.change(&cfg)
		_, err := join.New(cfg)
		if err == nil || !strings.HasPrefix(err.Error(), c.flag+":") {
			t.Errorf("case %d: New returned %v, want an error naming %s", i, err, c.flag)
		}
	}

	fs := pflag.NewFlagSet("join", pflag.ContinueOnError)
	var cfg join.Config
	cfg.AddFlags(fs)
	if cfg.MaxClockSkew != join.DefaultMaxClockSkew || join.DefaultMaxClockSkew != 5*time.Minute ||
		cfg.ArmTimeout != join.DefaultArmTimeout || join.DefaultArmTimeout != 2*time.Minute {
		t.Fatalf("flag defaults: --max-clock-skew %s, --arm-timeout %s", cfg.MaxClockSkew, cfg.ArmTimeout)
	}
	args := []string{"--box=b", "--deployment=d", "--console-key=c", "--release-key=r", "--identity-record=i",
		"--instance-id-file=f", "--instance-id-url=u", "--opt-dir=/o", "--arm-command=a", "--armed-marker=m",
		"--max-clock-skew=30s", "--arm-timeout=45s"}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	want := join.Config{Box: "b", Deployment: "d", ConsoleKey: "c", ReleaseKey: "r", IdentityRecord: "i",
		InstanceIDFile: "f", InstanceIDURL: "u", OptDir: "/o", ArmCommand: "a", ArmedMarker: "m",
		MaxClockSkew: 30 * time.Second, ArmTimeout: 45 * time.Second}
	if cfg != want {
		t.Fatalf("flags parsed into %+v", cfg)
	}

	w, err := join.New(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	spec := w.Spec()
	if spec.Name != "join" || spec.Instance != "box-c" ||
		!slices.Equal(spec.Subjects, []string{"steward.events.invitation.written.box-c", "steward.events.hostfloor.published"}) ||
		!slices.Equal(spec.Types, []string{events.TypeInvitationWritten, events.TypeHostFloorPublished}) {
		t.Fatalf("spec %+v", spec)
	}
}
