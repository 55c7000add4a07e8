package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	"filippo.io/age/armor"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/streamread"
	"github.com/steward-dev/steward/workers/workertest"
)

// runSteward runs a one-shot steward command and returns what it printed.
func runSteward(t testing.TB, env map[string]string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bins.steward, args...)
	cmd.Env = append(baseEnv(), envList(env)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("steward %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func envList(env map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// stewardService is a long-running steward process (a worker or the
// ingress) with its metrics and health on http.
type stewardService struct {
	*proc
	http string
}

// startWorker runs `steward worker <kind>` configured only through its
// STEWARD_* environment, as compose does, and waits until it is ready.
func startWorker(t testing.TB, kind string, env map[string]string) *stewardService {
	t.Helper()
	s := &stewardService{http: fmt.Sprintf("127.0.0.1:%d", workertest.FreePort(t))}
	env = maps.Clone(env)
	env["STEWARD_HTTP_ADDR"] = s.http
	s.proc = newProc(t, "steward-worker-"+kind, bins.steward, []string{"worker", kind}, envList(env))
	s.start()
	s.waitReady(t)
	return s
}

func (s *stewardService) waitReady(t testing.TB) {
	t.Helper()
	waitFor(t, s.name+" is ready", time.Minute, func() (bool, string) {
		if gone, err := s.exited(); gone {
			t.Fatalf("%s exited: %v\n%s", s.name, err, s.tail(30))
		}
		return httpOK("http://" + s.http + "/readyz")
	})
}

// metric scrapes one of the service's counters.
func (s *stewardService) metric(name string, labels ...string) (float64, error) {
	return metric("http://"+s.http+"/metrics", name, labels...)
}

// makeKey runs `steward keys` for one key of kind (ed25519, ecdsa-p256 or
// age) named name in dir, and returns the public half's path.
func makeKey(t testing.TB, dir, kind, name string) string {
	t.Helper()
	runSteward(t, nil, "keys", "--dir", dir, "--kind", kind, "--name", name)
	return filepath.Join(dir, name+".pub")
}

// recipientOf reads the age recipient `steward keys` wrote.
func recipientOf(t testing.TB, pub string) string {
	t.Helper()
	raw, err := os.ReadFile(pub)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(raw))
}

// encryptTo encrypts plaintext with age to recipient, armored, as a
// console or the age command line tool does.
func encryptTo(t testing.TB, recipient, plaintext string) string {
	t.Helper()
	r, err := age.ParseX25519Recipient(recipient)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	aw := armor.NewWriter(&buf)
	w, err := age.Encrypt(aw, r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(w, plaintext); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := aw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// outcomesByCause returns a worker instance's outcomes by the id of the
// event that caused them.
func outcomesByCause(t testing.TB, b *bus, worker, instance string) map[string][]event.Event {
	t.Helper()
	out, err := readOutcomes(b, worker, instance)
	if err != nil {
		t.Fatalf("outcomes of %s-%s: %v", worker, instance, err)
	}
	return out
}

func readOutcomes(b *bus, worker, instance string) (map[string][]event.Event, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out := map[string][]event.Event{}
	err := streamread.Each(ctx, b.js, streamread.Range{
		Stream:   events.StreamOutcomes,
		Subjects: []string{events.OutcomesPrefix + "." + worker + "." + instance},
	}, func(m jetstream.Msg) error {
		e, err := events.Decode(m.Headers(), m.Data())
		if err != nil {
			return err
		}
		cause, _ := e.Extensions()["causationid"].(string)
		out[cause] = append(out[cause], e)
		return nil
	})
	return out, err
}

// waitOutcome waits until the event with id has an outcome of worker and
// instance, and returns it. A cluster still settling may refuse a read:
// that is waited out too.
func waitOutcome(t testing.TB, b *bus, worker, instance, id string, timeout time.Duration) event.Event {
	t.Helper()
	var got event.Event
	waitFor(t, fmt.Sprintf("an outcome of %s-%s for event %s", worker, instance, id), timeout, func() (bool, string) {
		all, err := readOutcomes(b, worker, instance)
		if err != nil {
			return false, err.Error()
		}
		list := all[id]
		if len(list) == 0 {
			return false, "none yet"
		}
		got = list[0]
		return true, ""
	})
	return got
}

// publish publishes one event and fails the test if it is not stored.
func (b *bus) publish(t testing.TB, e event.Event) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ack, _, err := b.publishAcked(ctx, e)
	if err != nil {
		t.Fatalf("publish %s: %v", e.Type(), err)
	}
	return ack.Sequence
}
