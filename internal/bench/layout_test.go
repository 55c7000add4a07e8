package bench

import (
	"context"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// streamConfig is stream's configuration as the server holds it, its name,
// subjects and description taken out: what the layouts are compared by.
func streamConfig(t *testing.T, env *Env, stream string) jetstream.StreamConfig {
	t.Helper()
	s, err := env.pubJS.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Name, cfg.Subjects, cfg.Description = "", nil, ""
	return cfg
}

// TestStreamsAreLaidOutAsTheySay compares the layouts' streams as the
// server holds them: the shaped stream is STEWARD_EVENTS but for where it
// takes its subjects and republishes its notices; the one without notices
// is the shaped one without RePublish; the plain one is what a nats.go user
// gets from a name, subjects and file storage, and none of
// STEWARD_EVENTS's features.
func TestStreamsAreLaidOutAsTheySay(t *testing.T) {
	env, err := Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()

	steward, shaped := streamConfig(t, env, events.StreamEvents), streamConfig(t, env, Shaped.stream())
	if shaped.RePublish == nil || !shaped.RePublish.HeadersOnly || shaped.RePublish.Destination != storedPrefix+".>" {
		t.Fatalf("the shaped stream republishes %+v, want its stored notices, headers only, under %s", shaped.RePublish, storedPrefix)
	}
	steward.RePublish, shaped.RePublish = nil, nil
	if !reflect.DeepEqual(steward, shaped) {
		t.Fatalf("the shaped stream differs from %s:\n%+v\n%+v", events.StreamEvents, shaped, steward)
	}
	if noNotices := streamConfig(t, env, ShapedNoNotices.stream()); !reflect.DeepEqual(noNotices, shaped) {
		t.Fatalf("the stream without notices is not the shaped one without RePublish:\n%+v\n%+v", noNotices, shaped)
	}

	user := jetstream.StreamConfig{Name: "USER", Subjects: []string{"user.>"}, Storage: jetstream.FileStorage}
	if _, err := env.pubJS.CreateStream(context.Background(), user); err != nil {
		t.Fatal(err)
	}
	plain := streamConfig(t, env, Plain.stream())
	if want := streamConfig(t, env, "USER"); !reflect.DeepEqual(plain, want) {
		t.Fatalf("the plain stream is not what a user's name, subjects and storage make:\n%+v\n%+v", plain, want)
	}
	if plain.RePublish != nil || plain.AllowDirect || plain.Discard == steward.Discard || plain.MaxConsumers == steward.MaxConsumers {
		t.Fatalf("the plain stream has STEWARD_EVENTS's features: %+v", plain)
	}
}

// TestLayoutsPublishWhatTheySay runs a raw turn on each layout and reads
// back what the server stored and republished: the shaped stream stores
// Steward's messages whole and sends a stored notice for each; without
// notices none is sent; the other two store the messages without
// Nats-Msg-Id, or with no header but the ids.
func TestLayoutsPublishWhatTheySay(t *testing.T) {
	env, err := Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	// A channel subscription: the connection's reader puts each notice in
	// the channel itself, so after a flush every notice sent before it is
	// there to count.
	notices := make(chan *nats.Msg, 1000)
	sub, err := env.subNC.ChanSubscribe(storedPrefix+".>", notices)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	stewardHeaders := func() []string {
		msgs, err := env.messages(0, 1, 1)
		if err != nil {
			t.Fatal(err)
		}
		return headerNames(msgs[0].Header)
	}()

	const n = 20
	for _, c := range []struct {
		layout  Layout
		headers []string
		notices int64
	}{
		{Plain, stewardHeaders, 0},
		{Shaped, stewardHeaders, n},
		{ShapedNoNotices, stewardHeaders, 0},
		{ShapedNoMsgID, without(stewardHeaders, events.MsgIDHeader), n},
		{ShapedSmallHeaders, []string{events.MsgIDHeader, idHeader}, n},
	} {
		if _, err := env.Raw(context.Background(), Options{Events: n, Keys: 4, Timeout: time.Minute}, Ack, c.layout); err != nil {
			t.Fatalf("%s: %v", c.layout, err)
		}
		// The notices go out as the events are stored, before the
		// consumer sees them; the flush makes sure this connection has
		// read all the server sent it by now.
		if err := env.subNC.Flush(); err != nil {
			t.Fatal(err)
		}
		var got int64
		for len(notices) > 0 {
			<-notices
			got++
		}
		if got != c.notices {
			t.Errorf("%s: %d stored notices, want %d", c.layout, got, c.notices)
		}
		s, err := env.pubJS.Stream(context.Background(), c.layout.stream())
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != n {
			t.Fatalf("%s: %d messages stored, want %d", c.layout, info.State.Msgs, n)
		}
		stored, err := s.GetMsg(context.Background(), info.State.LastSeq)
		if err != nil {
			t.Fatal(err)
		}
		if got := headerNames(stored.Header); !reflect.DeepEqual(got, c.headers) {
			t.Errorf("%s: stored headers %v, want %v", c.layout, got, c.headers)
		}
	}
}

// headerNames are h's names, sorted, without those a direct get adds to
// its reply (the stream's name, the sequence, the time and the subject),
// which are not the message's.
func headerNames(h nats.Header) []string {
	var out []string
	for k := range h {
		switch k {
		case jetstream.StreamHeader, jetstream.SequenceHeader, jetstream.TimeStampHeaer, jetstream.SubjectHeader:
			continue
		}
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func without(names []string, name string) []string {
	var out []string
	for _, n := range names {
		if n != name {
			out = append(out, n)
		}
	}
	return out
}
