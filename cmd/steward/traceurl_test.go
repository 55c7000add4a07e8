package main

import (
	"strings"
	"testing"
)

// TestTraceURLIsChecked: serve and dev refuse a --trace-url that is not
// an http(s) template with {traceId}, or its environment twin, naming the
// flag, before they connect or start anything.
func TestTraceURLIsChecked(t *testing.T) {
	for _, c := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"serve, no placeholder", nil, []string{"serve", "--token", "t", "--trace-url", "https://jaeger.example/trace/"}, "holds no {traceId}"},
		{"serve, not http", nil, []string{"serve", "--token", "t", "--trace-url", "ftp://jaeger.example/{traceId}"}, "not an absolute http or https address"},
		{"serve, the env twin", []string{"STEWARD_TRACE_URL=jaeger/{traceId}"}, []string{"serve", "--token", "t"}, "not an absolute http or https address"},
		{"dev", nil, []string{"dev", "--dir", t.TempDir(), "--trace-url", "https://jaeger.example/trace"}, "holds no {traceId}"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := run(t, c.env, c.args...)
			if r.code == 0 || !strings.Contains(r.stderr, "--trace-url (STEWARD_TRACE_URL)") || !strings.Contains(r.stderr, c.want) {
				t.Fatalf("exit %d, stderr:\n%s", r.code, r.stderr)
			}
		})
	}
}
