package main

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestEnvName(t *testing.T) {
	for flag, want := range map[string]string{
		"registry":         "STEWARD_REGISTRY",
		"nats-url":         "STEWARD_NATS_URL",
		"cloudrun-project": "STEWARD_CLOUDRUN_PROJECT",
		"instance-id-file": "STEWARD_INSTANCE_ID_FILE",
	} {
		if got := envName(flag); got != want {
			t.Errorf("envName(%q) = %q, want %q", flag, got, want)
		}
	}
}

func newTestFlags() (*pflag.FlagSet, *string, *int, *time.Duration, *[]string) {
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	url := fs.String("nats-url", "nats://127.0.0.1:4222", "")
	replicas := fs.Int("replicas", 1, "")
	wait := fs.Duration("ack-wait", time.Second, "")
	kinds := fs.StringSlice("kind", []string{"age"}, "")
	return fs, url, replicas, wait, kinds
}

// TestApplyEnvSetsUnsetFlags proves a flag not given on the command line
// takes its twin's value, whatever its type, and that a flag whose twin is
// unset keeps its default.
func TestApplyEnvSetsUnsetFlags(t *testing.T) {
	t.Setenv("STEWARD_NATS_URL", "nats://10.0.0.1:4222")
	t.Setenv("STEWARD_REPLICAS", "3")
	t.Setenv("STEWARD_KIND", "ed25519,age")
	fs, url, replicas, wait, kinds := newTestFlags()
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if err := applyEnv(fs); err != nil {
		t.Fatal(err)
	}
	if *url != "nats://10.0.0.1:4222" || *replicas != 3 || strings.Join(*kinds, ",") != "ed25519,age" {
		t.Fatalf("url %q replicas %d kinds %v", *url, *replicas, *kinds)
	}
	if *wait != time.Second {
		t.Fatalf("ack-wait %v changed without STEWARD_ACK_WAIT", *wait)
	}
}

// TestApplyEnvCommandLineWins proves a flag given on the command line is
// not overridden by its twin.
func TestApplyEnvCommandLineWins(t *testing.T) {
	t.Setenv("STEWARD_NATS_URL", "nats://from-env:4222")
	t.Setenv("STEWARD_ACK_WAIT", "5s")
	fs, url, _, wait, _ := newTestFlags()
	if err := fs.Parse([]string{"--nats-url", "nats://from-flag:4222"}); err != nil {
		t.Fatal(err)
	}
	if err := applyEnv(fs); err != nil {
		t.Fatal(err)
	}
	if *url != "nats://from-flag:4222" {
		t.Fatalf("url %q: the environment overrode the command line", *url)
	}
	if *wait != 5*time.Second {
		t.Fatalf("ack-wait %v, want 5s from STEWARD_ACK_WAIT", *wait)
	}
}

// TestApplyEnvBadValueNamesTheVariable proves a value the flag refuses is
// an error naming the variable and its flag.
func TestApplyEnvBadValueNamesTheVariable(t *testing.T) {
	t.Setenv("STEWARD_REPLICAS", "three")
	fs, _, _, _, _ := newTestFlags()
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	err := applyEnv(fs)
	if err == nil || !strings.Contains(err.Error(), "STEWARD_REPLICAS") || !strings.Contains(err.Error(), "--replicas") {
		t.Fatalf("err %v, want one naming STEWARD_REPLICAS and --replicas", err)
	}
}

// TestEveryFlagHasATwin proves the twins reach every command's flags,
// including the worker packages' own (STEWARD_HIVE for --hive), through
// the command tree as cobra builds it.
func TestEveryFlagHasATwin(t *testing.T) {
	t.Setenv("STEWARD_HIVE", "h-from-env")
	t.Setenv("STEWARD_LOG_LEVEL", "debug")
	root := newRoot()
	cmd, _, err := root.Find([]string{"worker", "credential"})
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.ParseFlags(nil); err != nil {
		t.Fatal(err)
	}
	if err := applyEnv(cmd.Flags()); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"hive": "h-from-env", "log-level": "debug"} {
		f := cmd.Flags().Lookup(name)
		if f == nil || f.Value.String() != want {
			t.Fatalf("--%s = %v, want %q from its twin", name, f, want)
		}
	}
}
