package console

import "testing"

// TestTraceURL: a template is taken only as an http(s) address holding
// {traceId}, and only a W3C trace id (hex, not all zero) is put into it:
// the id comes from the bus.
func TestTraceURL(t *testing.T) {
	for _, bad := range []string{"https://jaeger.example/trace/", "ftp://jaeger.example/{traceId}", "jaeger.example/{traceId}", "javascript:alert(1)//{traceId}", "https:///{traceId}"} {
		if err := CheckTraceURL(bad); err == nil {
			t.Errorf("CheckTraceURL(%q) took it", bad)
		}
	}
	const tmpl = "https://jaeger.example/trace/{traceId}?from=steward"
	if err := CheckTraceURL(tmpl); err != nil {
		t.Fatal(err)
	}
	id := "4bf92f3577b34da6a3ce929d0e0e4736"
	if got := traceURL(tmpl, id); got != "https://jaeger.example/trace/"+id+"?from=steward" {
		t.Fatalf("traceURL: %q", got)
	}
	for _, bad := range []string{"", "00000000000000000000000000000000", "4BF92F3577B34DA6A3CE929D0E0E4736", "4bf92f3577b34da6a3ce929d0e0e473\"", "4bf92f3577b34da6"} {
		if got := traceURL(tmpl, bad); got != "" {
			t.Errorf("traceURL(%q) = %q; want no link", bad, got)
		}
	}
	if got := traceURL("", id); got != "" {
		t.Fatalf("no template linked to %q", got)
	}
}
