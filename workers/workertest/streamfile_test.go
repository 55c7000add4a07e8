package workertest_test

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/steward-dev/steward/events"
)

func runtimeGoexit() { runtime.Goexit() }

func writeStream(t *testing.T, list ...event.Event) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "stream.jsonl")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, e := range list {
		if err := events.WriteJSONL(f, e); err != nil {
			t.Fatal(err)
		}
	}
	return path
}
