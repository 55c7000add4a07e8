package main

import (
	"strings"
	"testing"

	"github.com/steward-dev/steward/workers"
)

func TestReadModeFlagTakesConsumerOrStream(t *testing.T) {
	var m workers.ReadMode
	f := readModeFlag{&m}
	for s, want := range map[string]workers.ReadMode{"stream": workers.ReadStream, "consumer": workers.ReadConsumer, "": workers.ReadConsumer} {
		if err := f.Set(s); err != nil || m != want {
			t.Errorf("--read-mode %q: %v, %v; want %v", s, m, err, want)
		}
	}
	m = workers.ReadStream
	if err := f.Set("queue"); err == nil || !strings.Contains(err.Error(), `read mode "queue": want consumer or stream`) || m != workers.ReadStream {
		t.Errorf("--read-mode queue: %v, mode now %v; want a refusal naming both modes and the mode unchanged", err, m)
	}
}
