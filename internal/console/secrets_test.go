package console_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// The secret pieces a handler's error may carry: an age identity (a
// misconfigured key file quoted back) and an age armored block (a sealed
// credential) that straddles the 2,000 characters a reason is cut at. The
// runtime's old copy cut first, dropping the block's END line so its
// pattern no longer matched, and knew nothing of identities: both reached
// the logs, the status document and the dead letter's reason.
const (
	leakBlockBody = "YWdlLWVuY3J5cHRpb24ub3JnL3YxCi0+IFgyNTUxOSBsZWFrZWQ"
	leakIdentity  = "AGE-SECRET-KEY-1LEAKEDLEAKEDLEAKEDLEAKEDLEAKEDLEAKEDLEAKEDLEAKEDLEAK"
)

func leakyError() error {
	head := "rotation for leak-hive could not be written with identity " + leakIdentity + ": "
	head += strings.Repeat("x", 1960-len(head))
	return errors.New(head + "-----BEGIN AGE ENCRYPTED FILE-----\n" + leakBlockBody + "\n-----END AGE ENCRYPTED FILE----- " + strings.Repeat("tail ", 800))
}

// leaks names what of the secret text is in out.
func leaks(out string) []string {
	var found []string
	for _, s := range []string{leakBlockBody, "AGE-SECRET-KEY-1", "-----BEGIN AGE"} {
		if strings.Contains(out, s) {
			found = append(found, s)
		}
	}
	return found
}

// TestNoComponentShowsASecret feeds a handler's error holding an armored
// block and an age identity past 2,000 characters to every component that
// logs, stores or prints an error: the runtime (its log, its span, the
// status document of a retrying key, the dead letter's reason), workertest
// (its result and log), ops (status, dead letters, a key's history) and the
// console (its pages). None may show either.
func TestNoComponentShowsASecret(t *testing.T) {
	r := newRig(t, nil)
	spec := workers.Spec{
		Name: "credential", Instance: "leak-hive",
		Subjects: []string{"steward.events.credential.rotated.leak-hive"},
		Types:    []string{events.TypeCredentialRotated},
	}
	// The handler fails as a transient error would (the log, the span and
	// the status document see it) until the status has been read, then as
	// a permanent one (the dead letter's reason).
	var permanent atomic.Bool
	h := workers.HandlerFunc(func(context.Context, *workers.Delivery) error {
		if !permanent.Load() {
			return leakyError()
		}
		return workers.Permanent(leakyError())
	})
	const sealed = "-----BEGIN AGE ENCRYPTED FILE-----\nx\n-----END AGE ENCRYPTED FILE-----"
	var logs workertest.Logs
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	workertest.Start(t, r.js, spec, h,
		workers.WithLogger(zerolog.New(&logs)), workers.WithTracerProvider(tp),
		workertest.StatusEvery(10*time.Millisecond),
		workers.WithMaxBackoff(200*time.Millisecond))
	workertest.PublishData(t, r.js, events.TypeCredentialRotated, "leak-hive",
		events.CredentialRotated{Hive: "leak-hive", Version: 1, ClientID: "c", Secret: sealed})

	// The status document while the key retries, as stored.
	docs := workertest.OperatorDocs(t, r.js)
	var status string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the runtime's log:\n%s", logs.String())
		}
	})
	workertest.WaitUntil(t, "a status document naming the retrying key", func() bool {
		raw, err := docs.KV().Get(context.Background(), events.StatusKey("credential", "leak-hive"))
		if err != nil {
			return false
		}
		status = string(raw.Value())
		return strings.Contains(status, "could not be written")
	})
	var st *ops.Status
	workertest.WaitUntil(t, "steward status to show the retrying key", func() bool {
		var err error
		st, err = ops.GetStatus(context.Background(), r.js, ops.StatusOptions{})
		return err == nil && strings.Contains(marshal(t, st), "could not be written")
	})
	c, _ := login(t, r.url)
	overview := get(t, c, r.url+"/")
	permanent.Store(true)

	var letters []events.DeadLetter
	workertest.WaitUntil(t, "the dead letter", func() bool {
		letters = workertest.DeadLetters(t, r.js, "credential", "leak-hive")
		return len(letters) == 1
	})
	list, err := ops.ListLetters(context.Background(), r.js, ops.LetterFilter{}, ops.Proofs{})
	if err != nil {
		t.Fatal(err)
	}
	history, err := ops.GetHistory(context.Background(), r.js, ops.HistoryOptions{Worker: "credential", Key: "leak-hive"})
	if err != nil {
		t.Fatal(err)
	}
	dlqPage := get(t, c, r.url+"/dlq")
	keyPage := get(t, c, r.url+"/key?"+url.Values{"worker": {"credential"}, "key": {"leak-hive"}}.Encode())

	var spanText strings.Builder
	for _, s := range spans.Ended() {
		spanText.WriteString(s.Status().Description + "\n")
		for _, e := range s.Events() {
			for _, a := range e.Attributes {
				spanText.WriteString(a.Value.Emit() + "\n")
			}
		}
	}

	// workertest runs the same handler in memory.
	// A failed assertion prints the run's errors: that is a log too.
	rec := &recordingTB{TB: t}
	res := workertest.NewRunner(rec, spec, h).
		WorkData(events.TypeCredentialRotated, "leak-hive", events.CredentialRotated{Hive: "leak-hive", Version: 2, ClientID: "c", Secret: sealed})
	res.AssertVerdicts(workertest.Applied)

	seen := map[string]string{
		"the runtime's log":              logs.String(),
		"the runtime's spans":            spanText.String(),
		"the status document, as stored": status,
		"steward status (ops)":           marshal(t, st),
		"the dead letter's reason":       letters[0].Reason,
		"the dead letters (ops)":         marshal(t, list),
		"the key's history (ops)":        marshal(t, history),
		"the console's overview":         overview,
		"the console's dead letters":     dlqPage,
		"the console's key page":         keyPage,
		"workertest's dead letter":       reasons(res.DeadLetters),
		"workertest's failure message":   rec.String(),
	}
	for where, out := range seen {
		if !strings.Contains(out, "could not be written") && where != "the runtime's spans" {
			t.Errorf("%s does not show the error at all, so it proves nothing:\n%.300s", where, out)
		}
		if found := leaks(out); len(found) > 0 {
			t.Errorf("%s shows %q", where, found)
		}
	}
	if spanText.Len() == 0 || !strings.Contains(spanText.String(), "could not be written") {
		t.Errorf("no span recorded the error, so the spans prove nothing: %q", spanText.String())
	}
}

// recordingTB keeps what a workertest assertion reports instead of failing
// the test with it.
type recordingTB struct {
	testing.TB
	mu   sync.Mutex
	msgs []string
}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
}

func (r *recordingTB) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.msgs, "\n")
}

// reasons are the dead letters' reasons; the letters themselves hold the
// sealed event as it was published, which a retry needs.
func reasons(list []events.DeadLetter) string {
	var out []string
	for _, d := range list {
		out = append(out, d.Reason)
	}
	return strings.Join(out, "\n")
}

func marshal(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
