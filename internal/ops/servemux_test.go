package ops_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/steward-dev/steward/internal/ops"
)

func TestServeMuxSaysWhyItIsNotReady(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "steward_test_total", Help: "a counter"}))
	var notReady error = errors.New("the consumer is not created yet")
	mux := ops.NewServeMux(reg, func() error { return notReady })
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "not ready: the consumer is not created yet") {
		t.Fatalf("/readyz before ready: %d %q", code, body)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz while not ready: %d, want 200 (alive all the same)", code)
	}
	notReady = nil
	if code, body := get("/readyz"); code != http.StatusOK || body != "ready\n" {
		t.Fatalf("/readyz once ready: %d %q", code, body)
	}
	if code, body := get("/metrics"); code != http.StatusOK || !strings.Contains(body, "steward_test_total 0") {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
}
