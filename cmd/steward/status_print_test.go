package main

import (
	"bytes"
	"regexp"
	"testing"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/ops"
)

// A hub whose server skips a sourced message after a reset says so under
// its NATS line, with the version and what to do, where an operator reads
// the status first.
func TestPrintStatusWarnsOfTheServerUnderItsLine(t *testing.T) {
	st := &ops.Status{Server: "nats://hub:4222", ServerName: "hub", ServerVersion: "2.15.2", Streams: []ops.Stream{}}
	st.ServerWarning = events.CheckSiteServer("the hub", st.Server, st.ServerVersion).Error()
	var out bytes.Buffer
	if err := printStatus(&out, st); err != nil {
		t.Fatal(err)
	}
	want := regexp.MustCompile(`(?m)^NATS nats://hub:4222 \(server hub, version 2\.15\.2\)\nwarning: the hub at nats://hub:4222 runs nats-server 2\.15\.2: .*upgrade the hub and every leaf node to 2\.15\.3 or later\n`)
	if !want.MatchString(out.String()) {
		t.Errorf("steward status does not warn of the server under its line:\n%s", out.String())
	}
}
