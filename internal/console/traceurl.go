package console

import (
	"fmt"
	"net/url"
	"strings"
)

// TraceIDPlaceholder is what a trace URL template holds where the trace id
// goes (--trace-url https://jaeger.example/trace/{traceId}).
const TraceIDPlaceholder = "{traceId}"

// CheckTraceURL checks a trace URL template: an absolute http or https
// address that holds TraceIDPlaceholder. The error names the rule broken,
// and the caller the flag.
func CheckTraceURL(template string) error {
	if !strings.Contains(template, TraceIDPlaceholder) {
		return fmt.Errorf("%q holds no %s: write where the trace id goes, e.g. https://jaeger.example/trace/%s", template, TraceIDPlaceholder, TraceIDPlaceholder)
	}
	u, err := url.Parse(strings.ReplaceAll(template, TraceIDPlaceholder, "0af7651916cd43dd8448eb211c80319c"))
	if err != nil {
		return fmt.Errorf("%q is not a URL: %w", template, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an absolute http or https address: the console links to it from its pages", template)
	}
	return nil
}

// traceURL is where the trace UI shows trace id, or "" when there is no
// template or the id is not a W3C trace id (32 lower-case hex digits, not
// all zero): the id comes from the bus, so only an id that is nothing but
// hex digits is put into a link.
func traceURL(template, id string) string {
	if template == "" || len(id) != 32 || strings.Trim(id, "0") == "" {
		return ""
	}
	for _, c := range id {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return ""
		}
	}
	return strings.ReplaceAll(template, TraceIDPlaceholder, id)
}
