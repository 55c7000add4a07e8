package console_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/agekey"
	"github.com/steward-dev/steward/internal/console"
	"github.com/steward-dev/steward/internal/streamread"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/credential"
	"github.com/steward-dev/steward/workers/workertest"
)

const (
	testToken = "console-test-token-0123456789"
	testHive  = "hive-1"
)

// UnsignedTestSigner is a test double of the Signer hook `steward serve
// --signing-key` will provide: it passes the event through unsigned. The
// credential worker does not check signatures yet, so with it the rest of
// the flow (sealing in the page, the real worker applying, the outcome on
// the key page) is the real one.
type UnsignedTestSigner struct{ calls atomic.Int32 }

func (s *UnsignedTestSigner) Sign(_ context.Context, e event.Event) (event.Event, error) {
	s.calls.Add(1)
	return e, nil
}

// rig is a console and ingress in process, on an embedded JetStream, with
// the real credential worker for testHive.
type rig struct {
	t         testing.TB
	srv       *workertest.Server
	js        jetstream.JetStream
	url       string
	recipient string
	credDir   string
	worker    *workertest.Running
	// broken makes the credential handler panic, as a bug would, so the
	// runtime dead-letters the event (WithMaxPanics(1)); clearing it is
	// deploying the fix.
	broken atomic.Bool
}

func newRig(t testing.TB, signer console.Signer) *rig {
	t.Helper()
	r := &rig{t: t, srv: workertest.StartServer(t)}
	r.js = r.srv.JetStream(t)
	dir := t.TempDir()
	idPath := filepath.Join(dir, "hive.key")
	rcpt, err := agekey.Generate(idPath)
	if err != nil {
		t.Fatal(err)
	}
	r.recipient = rcpt
	r.credDir = filepath.Join(dir, "credentials")
	cw, err := credential.New(credential.Config{Hive: testHive, AgeIdentity: idPath, CredentialDir: r.credDir})
	if err != nil {
		t.Fatal(err)
	}
	h := workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		if r.broken.Load() {
			panic("test: the credential handler is broken until the fix is deployed")
		}
		return cw.Handle(ctx, d)
	})
	r.worker = workertest.Start(t, r.js, cw.Spec(), h, workers.WithMaxPanics(1), workers.WithLogger(zerolog.Nop()))

	pub := publisher.New(r.js)
	in, err := publisher.NewIngress(pub, publisher.IngressConfig{Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	c, err := console.New(console.Config{
		Token:       testToken,
		JS:          r.js,
		Publisher:   publisher.New(r.js, publisher.WithSource(console.Source)),
		DeadLetters: &cliDLQ{t: t, js: r.js, natsURL: r.srv.URL()},
		Signer:      signer,
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(publisher.IngressPath, in)
	c.Mount(mux)
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	r.url = ts.URL
	return r
}

// rotation publishes a valid rotation of testHive, sealed with agekey,
// past the console (as another publisher would).
func (r *rig) rotation(version int, clientID, secret string) {
	r.t.Helper()
	ct, err := agekey.Encrypt(r.recipient, []byte(secret))
	if err != nil {
		r.t.Fatal(err)
	}
	workertest.PublishData(r.t, r.js, events.TypeCredentialRotated, testHive,
		events.CredentialRotated{Hive: testHive, Version: uint64(version), ClientID: clientID, Secret: ct})
}

// cliDLQ is the console's DeadLetters in these tests. steward dlq's code
// lives in package main (cmd/steward/dlq.go), which a test here cannot
// import, so a retry runs the steward binary itself: `steward dlq retry
// <seq>`, the very code `steward serve` hands the console. Listing and
// showing read letters with events.ParseDeadLetter, as dlq.go does.
type cliDLQ struct {
	t       testing.TB
	js      jetstream.JetStream
	natsURL string
}

var (
	buildOnce  sync.Once
	stewardBin string
	buildErr   error
)

// steward builds cmd/steward once per test binary.
func steward(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "steward-console-test-")
		if err != nil {
			buildErr = err
			return
		}
		stewardBin = filepath.Join(dir, "steward")
		out, err := exec.Command("go", "build", "-o", stewardBin, "github.com/steward-dev/steward/cmd/steward").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/steward: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return stewardBin
}

func (d *cliDLQ) List(ctx context.Context, f console.Filter) ([]console.Letter, error) {
	var out []console.Letter
	err := streamread.Each(ctx, d.js, streamread.Range{Stream: events.StreamDLQ}, func(m jetstream.Msg) error {
		meta, err := m.Metadata()
		if err != nil {
			return err
		}
		l := events.ParseDeadLetter(meta.Sequence.Stream, m.Subject(), m.Headers(), m.Data())
		if f.Match(l) {
			out = append(out, console.Letter{DeadLetter: l})
		}
		return nil
	})
	return out, err
}

func (d *cliDLQ) Get(ctx context.Context, seq uint64) (console.Letter, error) {
	s, err := d.js.Stream(ctx, events.StreamDLQ)
	if err != nil {
		return console.Letter{}, err
	}
	m, err := s.GetMsg(ctx, seq)
	if err != nil {
		return console.Letter{}, fmt.Errorf("no dead letter at %d: %w", seq, err)
	}
	return console.Letter{DeadLetter: events.ParseDeadLetter(m.Sequence, m.Subject, m.Header, m.Data)}, nil
}

var retriedLine = regexp.MustCompile(`retried dlq seq=\d+ id=(\S+) worker=\S+ subject=(\S+) new-seq=(\d+)`)

func (d *cliDLQ) Retry(ctx context.Context, l console.Letter) (console.Retried, error) {
	cmd := exec.CommandContext(ctx, steward(d.t), "dlq", "retry", strconv.FormatUint(l.DLQSequence, 10), "--nats-url", d.natsURL)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return console.Retried{}, fmt.Errorf("steward dlq retry: %v: %s", err, stderr.String())
	}
	m := retriedLine.FindStringSubmatch(stdout.String())
	if m == nil {
		return console.Retried{}, fmt.Errorf("steward dlq retry printed no retried line: %q", stdout.String())
	}
	seq, _ := strconv.ParseUint(m[3], 10, 64)
	return console.Retried{EventID: m[1], Subject: m[2], Sequence: seq}, nil
}

func (d *cliDLQ) Remove(ctx context.Context, seq uint64) error {
	return console.RemoveLetter(ctx, d.js, seq)
}
