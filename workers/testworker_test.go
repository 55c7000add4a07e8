package workers_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// The runtime is tested with credential.rotated events on a test worker:
// the hive is the key, the version tells events apart.
const testWorker = "rt"

func spec(instance string) workers.Spec {
	return workers.Spec{
		Name:     testWorker,
		Instance: instance,
		Subjects: []string{"steward.events.credential.rotated.>"},
		Types:    []string{events.TypeCredentialRotated},
	}
}

func publishRotation(t testing.TB, js jetstream.JetStream, hive string, version uint64) publisher.Ack {
	t.Helper()
	return workertest.PublishData(t, js, events.TypeCredentialRotated, hive, events.CredentialRotated{
		Hive: hive, Version: version, ClientID: "client-" + strconv.FormatUint(version, 10),
		Secret: "-----BEGIN AGE ENCRYPTED FILE-----\nnot-a-real-secret\n-----END AGE ENCRYPTED FILE-----\n",
	})
}

func versionOf(t testing.TB, d *workers.Delivery) uint64 {
	var data events.CredentialRotated
	if err := d.DataAs(&data); err != nil {
		t.Error(err)
	}
	return data.Version
}

// fastRetries keeps retry delays short so tests finish quickly.
func fastRetries() workers.Option {
	return workers.WithMaxBackoff(50 * time.Millisecond)
}

// recorder counts handler calls per version and remembers their order.
type recorder struct {
	mu    sync.Mutex
	calls map[uint64]int
	order []string
}

func newRecorder() *recorder { return &recorder{calls: map[uint64]int{}} }

func (r *recorder) record(key string, v uint64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls[v]++
	r.order = append(r.order, key+":"+strconv.FormatUint(v, 10))
	return r.calls[v]
}

func (r *recorder) count(v uint64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[v]
}

func consumerInfo(t testing.TB, js jetstream.JetStream, name string) *jetstream.ConsumerInfo {
	t.Helper()
	c, err := js.Consumer(context.Background(), events.StreamEvents, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// counter finds steward_events_total for the result in a registry.
func counter(t testing.TB, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	return metric(t, reg, "steward_events_total", "result", result)
}

// dieHolding starts a worker on its own connection whose handler takes the
// first event it gets and hangs, as a process killed mid-handler does, then
// closes that connection. It returns once the event is held and the
// connection is gone: the server redelivers the event only after AckWait.
func dieHolding(t *testing.T, srv *workertest.Server, sp workers.Spec, ackWait time.Duration, publish func()) {
	t.Helper()
	dieHoldingAfter(t, srv, sp, ackWait, publish, nil)
}

// dieHoldingAfter is dieHolding whose handler first calls work, when
// given, as a handler killed after some of its work does.
func dieHoldingAfter(t *testing.T, srv *workertest.Server, sp workers.Spec, ackWait time.Duration, publish func(), work func(context.Context, *workers.Delivery) error) {
	t.Helper()
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	var once sync.Once
	workertest.Start(t, js, sp, workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		if work != nil {
			if err := work(ctx, d); err != nil {
				t.Error(err)
			}
		}
		once.Do(func() { close(started) })
		select {
		case <-hang:
		case <-ctx.Done():
		}
		return errors.New("killed")
	}), workers.WithAckWait(ackWait), workers.WithShutdownGrace(time.Millisecond))
	publish()
	<-started
	nc.Close()
	// Until the server drops the dead connection's pull requests, it could
	// still hand that connection the next event.
	observer := srv.JetStream(t)
	workertest.WaitUntil(t, "the dead worker's pull requests are gone", func() bool {
		return consumerInfo(t, observer, sp.Name+"-"+sp.Instance).NumWaiting == 0
	})
}

// latestSpec is spec under latest-wins: a rotation's version is its rank,
// and a rotation whose client id says "forged" stands for one that fails
// the worker's verification.
func latestSpec(instance string) workers.Spec {
	s := spec(instance)
	s.Rank = func(_ context.Context, d *workers.Delivery) (uint64, error) {
		var data events.CredentialRotated
		if err := d.DataAs(&data); err != nil {
			return 0, err
		}
		if strings.HasPrefix(data.ClientID, "forged") {
			return 0, errors.New("the rotation is not signed by the controller")
		}
		return data.Version, nil
	}
	return s
}

// outcomeTypes counts a worker instance's outcomes by type suffix
// (applied, superseded, refused...).
func outcomeTypes(t testing.TB, js jetstream.JetStream, instance string) map[string]int {
	t.Helper()
	n := map[string]int{}
	for _, e := range workertest.Outcomes(t, js, testWorker, instance) {
		n[strings.TrimSuffix(strings.TrimPrefix(e.Type(), "dev.steward."+testWorker+"."), ".v1")]++
	}
	return n
}
