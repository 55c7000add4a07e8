package events_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers/workertest"
)

// A hub or leaf node older than the release that answers a consumer reset
// with the reset's own sequence is named, with its version and what to do;
// the server the tests run, and anything newer, passes.
func TestCheckSiteServerNamesAServerThatSkipsAMessageAfterAReset(t *testing.T) {
	for _, v := range []string{"2.15.2", "v2.14.10", "2.12.1-beta", "2.15.3-RC.1"} {
		err := events.CheckSiteServer("site site-a's leaf node", "nats://10.0.0.7:4222", v)
		if !errors.Is(err, events.ErrSiteServerTooOld) {
			t.Errorf("nats-server %s: %v, want ErrSiteServerTooOld", v, err)
			continue
		}
		for _, want := range []string{"site site-a's leaf node", "nats://10.0.0.7:4222", "nats-server " + v, "upgrade", events.MinSiteServerVersion} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("nats-server %s: %q does not say %q", v, err, want)
			}
		}
	}
	for _, v := range []string{server.VERSION, "2.15.3", "v2.16.0", "3.0.0"} {
		if err := events.CheckSiteServer("the hub", "nats://hub:4222", v); err != nil {
			t.Errorf("nats-server %s: %v, want nil", v, err)
		}
	}
	// A version the server reports in a form not understood is left to
	// the server itself, never refused.
	for _, v := range []string{"", "dev", "2"} {
		if !events.ServerAtLeast(v, events.MinSiteServerVersion) {
			t.Errorf("ServerAtLeast(%q) = false, want the benefit of the doubt", v)
		}
	}
	if events.ServerAtLeast("2.10.29", "2.11.0") || !events.ServerAtLeast("2.11.0", "2.11.0") {
		t.Error("ServerAtLeast does not compare minor versions")
	}
}

// The server Steward runs answers a reset of a site's consumer for the
// hub with the sequence it was reset to, however fast the consumer
// delivers after it: the source counts what the answer says delivered as
// stored, so a later sequence there is a message skipped for good.
// nats-server 2.15.2 answered 2 to 5 of the 1,000 late, in each of three
// runs.
func TestTheServerAnswersAResetWithTheSequenceItResetTo(t *testing.T) {
	js := workertest.StartServer(t).JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SITE_OUTCOMES", Subjects: []string{"site.outcomes.>"}})
	if err != nil {
		t.Fatal(err)
	}
	const messages, resets = 2000, 1000
	for i := range messages {
		if _, err := js.PublishAsync("site.outcomes.x", []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("the messages were not all acknowledged")
	}
	cfg := events.HubSourceConsumerConfig("SITE_OUTCOMES", "site-a")
	// The hub's side: something takes the deliveries, so the consumer
	// delivers as soon as each reset lets it.
	sub, err := js.Conn().SubscribeSync(cfg.DeliverSubject)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateOrUpdatePushConsumer(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	late := 0
	for range resets {
		r, err := st.ResetConsumer(ctx, cfg.Durable)
		if err != nil {
			t.Fatal(err)
		}
		if r.Delivered.Stream != r.ResetSeq-1 {
			late++
		}
	}
	if late > 0 {
		t.Errorf("%d of %d resets were answered with deliveries made after the reset: a source would skip those messages (nats-server %s; %s or later answers with the reset's sequence)",
			late, resets, server.VERSION, events.MinSiteServerVersion)
	}
}
