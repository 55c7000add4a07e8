package main

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	"github.com/ThreeDotsLabs/watermill/message"
	js "github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/internal/bench"
)

// idHeader is where the bench's events carry their id; Watermill hands
// every header on as metadata.
const idHeader = "ce-id"

// consume subscribes to stream as a Watermill user does, with the
// subscriber's defaults (its own connection to url, an ephemeral consumer,
// AckSync) but for a logger that writes nothing: the default one logs a
// line for every message. Its handler marks the event handled and acks it;
// the subscriber then confirms the ack with a DoubleAck, which marks it
// settled.
func consume(ctx context.Context, url, stream string, marks bench.Marks) (func() error, error) {
	sub, err := jetstream.NewSubscriber(jetstream.SubscriberConfig{
		URL:                 url,
		Logger:              watermill.NopLogger{},
		AckAsync:            false,
		ResourceInitializer: confirming(jetstream.EphemeralConsumer(), marks),
	})
	if err != nil {
		return nil, fmt.Errorf("watermill subscriber on %s: %w", url, err)
	}
	// The topic is the stream's name: the default consumer finds its
	// stream by it.
	msgs, err := sub.Subscribe(ctx, stream)
	if err != nil {
		_ = sub.Close()
		return nil, fmt.Errorf("watermill subscribe to %s: %w", stream, err)
	}
	handled := make(chan struct{})
	go func() {
		defer close(handled)
		for m := range msgs {
			handle(m, marks)
		}
	}()
	return func() error {
		err := sub.Close()
		<-handled
		return err
	}, nil
}

// handle is the path's no-op handler.
func handle(m *message.Message, marks bench.Marks) {
	marks.Handled(m.Metadata.Get(idHeader))
	m.Ack()
}

// confirming wraps init so that the consumer it makes hands Watermill
// messages whose confirmed ack, once the server has confirmed it, marks
// the event settled: the subscriber confirms inside its own callback,
// where a handler cannot see it.
func confirming(init jetstream.ResourceInitializer, marks bench.Marks) jetstream.ResourceInitializer {
	return func(ctx context.Context, j js.JetStream, topic string) (js.Consumer, func(context.Context, watermill.LoggerAdapter), error) {
		c, closer, err := init(ctx, j, topic)
		if err != nil {
			return nil, closer, err
		}
		return confirmingConsumer{Consumer: c, marks: marks}, closer, nil
	}
}

// confirmingConsumer is a JetStream consumer whose messages mark their
// event settled when their DoubleAck returns without error.
type confirmingConsumer struct {
	js.Consumer
	marks bench.Marks
}

// Consume is the consumer's, each message wrapped.
func (c confirmingConsumer) Consume(h js.MessageHandler, opts ...js.PullConsumeOpt) (js.ConsumeContext, error) {
	return c.Consumer.Consume(func(m js.Msg) { h(confirmedMsg{Msg: m, marks: c.marks}) }, opts...)
}

// confirmedMsg is a message whose DoubleAck marks its event settled.
type confirmedMsg struct {
	js.Msg
	marks bench.Marks
}

// DoubleAck is the message's, the event marked settled once the server
// has confirmed the ack.
func (m confirmedMsg) DoubleAck(ctx context.Context) error {
	if err := m.Msg.DoubleAck(ctx); err != nil {
		return err
	}
	m.marks.Settled(m.Headers().Get(idHeader))
	return nil
}
