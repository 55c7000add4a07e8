package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/steward-dev/steward/workers"
)

type pluginConfig struct{ Hive string }

type pluginWorker struct{ hive string }

func (*pluginWorker) Handle(context.Context, *workers.Delivery) error { return nil }
func (w *pluginWorker) Spec() workers.Spec                            { return workers.Spec{Name: "test", Instance: w.hive} }
func (*pluginWorker) Close() error                                    { return nil }

func testPlugin() plugin[pluginConfig, *pluginWorker] {
	return plugin[pluginConfig, *pluginWorker]{
		name:     "test",
		addFlags: func(c *pluginConfig, fs *pflag.FlagSet) { fs.StringVar(&c.Hive, "hive", "", "the hive") },
		newWorker: func(c pluginConfig) (*pluginWorker, error) {
			if c.Hive == "" {
				return nil, errors.New("--hive is required")
			}
			return &pluginWorker{hive: c.Hive}, nil
		},
	}
}

func TestPluginBuildsTheWorkerFromItsParsedFlags(t *testing.T) {
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	build := testPlugin().bind(fs)
	if err := fs.Parse([]string{"--hive", "h1"}); err != nil {
		t.Fatal(err)
	}
	s, err := build()
	if err != nil || s.Spec().Instance != "h1" {
		t.Fatalf("built %v, %v; want the worker of hive h1", s, err)
	}
}

// A failing New must give a nil interface, not a nil *Worker inside one,
// so the caller's `s == nil` and its error agree.
func TestPluginWhoseNewFailsReturnsNoService(t *testing.T) {
	s, err := testPlugin().bind(pflag.NewFlagSet("test", pflag.ContinueOnError))()
	if err == nil || s != nil {
		t.Fatalf("built %#v, %v; want no service and New's error", s, err)
	}
}

func TestPluginWithoutDevSaysSo(t *testing.T) {
	_, _, err := testPlugin().devService(context.Background(), t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "worker test has no development mode") {
		t.Fatalf("dev of a plugin without one: %v", err)
	}
}
