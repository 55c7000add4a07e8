package ops

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// Paused is a worker instance's consumer after a Pause or a Resume.
type Paused struct {
	Consumer string `json:"consumer"`
	Paused   bool   `json:"paused"`
	// Until is when the server resumes it by itself.
	Until *time.Time `json:"until,omitempty"`
	// Note says what the operator should know of how it takes effect:
	// a stream reader at a site resumed from the hub is not woken.
	Note string `json:"note,omitempty"`
}

// Pause stops the server delivering the instance's events until until (or
// an earlier Resume). The runtime keeps running and pulling; events wait
// at the server, nothing is lost or redelivered. It needs nats-server 2.11
// or later. A stream reader is paused by a pause document, which docs
// signs as the operator: an instance believes no other.
func Pause(ctx context.Context, js jetstream.JetStream, docs *events.Store, worker, instance string, until time.Time) (Paused, error) {
	if !until.After(time.Now()) {
		return Paused{}, fmt.Errorf("pause %s until %s: that time has passed; give a time to come", ConsumerName(worker, instance), until.UTC().Format(time.RFC3339))
	}
	if reads, err := readsStream(ctx, js, worker, instance); err != nil {
		return Paused{}, err
	} else if reads {
		if err := pauseStream(ctx, js, docs, worker, instance, until); err != nil {
			return Paused{}, err
		}
		u := until.UTC()
		return Paused{Consumer: ConsumerName(worker, instance), Paused: true, Until: &u}, nil
	}
	name, err := pausable(ctx, js, worker, instance)
	if err != nil {
		return Paused{}, err
	}
	resp, err := js.PauseConsumer(ctx, events.StreamEvents, name, until)
	if err != nil {
		return Paused{}, fmt.Errorf("pause %s on %s: %w", name, ServerURL(js), err)
	}
	return pausedOf(name, resp), nil
}

// Resume lets the server deliver the instance's events again at once.
func Resume(ctx context.Context, js jetstream.JetStream, docs *events.Store, worker, instance string) (Paused, error) {
	if reads, err := readsStream(ctx, js, worker, instance); err != nil {
		return Paused{}, err
	} else if reads {
		if err := resumeStream(ctx, js, docs, worker, instance); err != nil {
			return Paused{}, err
		}
		return Paused{Consumer: ConsumerName(worker, instance), Note: acrossLink(js)}, nil
	}
	name, err := pausable(ctx, js, worker, instance)
	if err != nil {
		return Paused{}, err
	}
	resp, err := js.ResumeConsumer(ctx, events.StreamEvents, name)
	if err != nil {
		return Paused{}, fmt.Errorf("resume %s on %s: %w", name, ServerURL(js), err)
	}
	wakeConsumer(js, name)
	return pausedOf(name, resp), nil
}

// wakeWindow is how long the wake-up's pull request waits at the server.
const wakeWindow = 500 * time.Millisecond

// wakeConsumer has the server hand a resumed consumer's held events to the
// pulls that waited through the pause. nats-server (2.11 to 2.15) resumes
// a consumer without looking at its waiting pulls again, so they got
// nothing until they expired and the worker pulled anew: half a minute
// (steward resume used to say the events flow again, and the held event
// applied 27 s later). Any new pull request makes the server look; this
// one asks for at most one byte, so it is refused every event (409
// Message Size Exceeds MaxBytes) and takes none of them: the worker's own
// pull, waiting ahead of it, gets them. Nobody waits for its answer. Best
// effort: the consumer is resumed whatever happens here, and at worst its
// pull's expiry delivers.
func wakeConsumer(js jetstream.JetStream, name string) {
	nc := js.Conn()
	if nc == nil {
		return
	}
	req := fmt.Sprintf(`{"batch":1,"max_bytes":1,"expires":%d}`, wakeWindow.Nanoseconds())
	if err := nc.PublishRequest(fmt.Sprintf("$JS.API.CONSUMER.MSG.NEXT.%s.%s", events.StreamEvents, name), nc.NewInbox(), []byte(req)); err == nil {
		_ = nc.FlushTimeout(wakeWindow)
	}
}

func pausedOf(name string, resp *jetstream.ConsumerPauseResponse) Paused {
	p := Paused{Consumer: name, Paused: resp.Paused}
	if resp.Paused {
		u := resp.PauseUntil.UTC()
		p.Until = &u
	}
	return p
}

// readsStream says whether the instance reads the stream itself (the
// runtime's ReadStream: a cursor and no consumer), so its pause is the
// pause document its reader obeys rather than a consumer's.
func readsStream(ctx context.Context, js jetstream.JetStream, worker, instance string) (bool, error) {
	if err := events.CheckKey(worker); err != nil {
		return false, fmt.Errorf("worker: %w", err)
	}
	if err := events.CheckKey(instance); err != nil {
		return false, fmt.Errorf("instance: %w", err)
	}
	if _, err := js.Consumer(ctx, events.StreamEvents, ConsumerName(worker, instance)); err == nil || !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return false, nil
	}
	kv, err := js.KeyValue(ctx, events.CheckpointBucket)
	if err != nil {
		return false, nil
	}
	_, err = kv.Get(ctx, events.CursorKey(worker, instance))
	return err == nil, nil
}

// pauseStream writes the stream reader's pause, signed as the operator, and
// tells the instance on its control subject, so it stops at once.
func pauseStream(ctx context.Context, js jetstream.JetStream, docs *events.Store, worker, instance string, until time.Time) error {
	if docs == nil || docs.Signer() == nil || docs.Signer().By() != events.OperatorWriter {
		return fmt.Errorf("pause %s: a stream reader believes only a pause the operator signed, and no operator document key was given (it sits beside the operator's credentials as operator.dockey; steward dev and steward creds issue operator make it)", ConsumerName(worker, instance))
	}
	if _, err := docs.Set(ctx, events.PauseKey(worker, instance), events.Pause{Until: until.UTC()}); err != nil {
		return fmt.Errorf("pause %s: %w", ConsumerName(worker, instance), err)
	}
	return js.Conn().Publish(events.ControlSubject(worker, instance), nil)
}

// resumeStream ends a stream reader's pause (see pauseStream). Anyone may
// delete a pause, which only lets the instance read: the delete needs no
// signature.
func resumeStream(ctx context.Context, js jetstream.JetStream, docs *events.Store, worker, instance string) error {
	if docs == nil {
		kv, err := js.KeyValue(ctx, events.CheckpointBucket)
		if err != nil {
			return fmt.Errorf("resume %s: the checkpoint bucket: %w", ConsumerName(worker, instance), err)
		}
		docs = events.NewStore(kv, events.StoreOptions{})
	}
	if err := docs.Delete(ctx, events.PauseKey(worker, instance)); err != nil {
		return fmt.Errorf("resume %s: %w", ConsumerName(worker, instance), err)
	}
	return js.Conn().Publish(events.ControlSubject(worker, instance), nil)
}

// acrossLink says, for a stream reader resumed through js, when js is
// another domain's JetStream reached across a leaf link (a site's, from the
// hub): the wake-up on the control subject stays on this side, as the link
// carries none of Steward's subjects (events.SiteLinkDenied), so the reader
// sees the resume at its next read, not at once.
func acrossLink(js jetstream.JetStream) string {
	domain := js.Options().Domain
	if domain == "" || js.Conn().ConnectedDomain() == domain {
		return ""
	}
	return fmt.Sprintf("the pause is lifted in %s's bucket, but the wake-up does not cross the leaf link: the reader reads again at its next reconnect or resync (within %s); to wake it at once, run this against %s's leaf node (--nats-url nats://LEAF --js-domain %s)",
		domain, streamResync, domain, domain)
}

// streamResync is how long at most a stream reader goes without reading
// again with nothing to wake it (workers' default resync, 5 minutes, spread
// from half of it to one and a half times it).
const streamResync = "7.5 minutes"

// pausable checks the server can pause consumers and that the instance's
// consumer exists, and returns its name.
func pausable(ctx context.Context, js jetstream.JetStream, worker, instance string) (string, error) {
	if err := events.CheckKey(worker); err != nil {
		return "", fmt.Errorf("worker: %w", err)
	}
	if err := events.CheckKey(instance); err != nil {
		return "", fmt.Errorf("instance: %w", err)
	}
	name := ConsumerName(worker, instance)
	if nc := js.Conn(); nc != nil && !events.ServerAtLeast(nc.ConnectedServerVersion(), "2.11.0") {
		return "", fmt.Errorf("the NATS server at %s is version %s; pausing a consumer needs 2.11 or later: upgrade it, or stop the worker's processes instead",
			ServerURL(js), nc.ConnectedServerVersion())
	}
	if _, err := js.Consumer(ctx, events.StreamEvents, name); err != nil {
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return "", fmt.Errorf("worker instance %s has no consumer on %s at %s: check the worker and instance with `steward status`", name, events.StreamEvents, ServerURL(js))
		}
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return "", &NoStreamsError{Server: ServerURL(js)}
		}
		return "", fmt.Errorf("look up consumer %s: %w", name, err)
	}
	return name, nil
}
