package ops_test

import (
	"errors"
	"io"
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
	hs := httptest.NewServer(ops.NewServeMux(reg, func() error { return notReady }))
	defer hs.Close()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
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
