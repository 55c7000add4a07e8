package workers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// ReadMode is how a worker instance reads its events from STEWARD_EVENTS.
type ReadMode int

const (
	// ReadConsumer reads through the instance's durable pull consumer,
	// <worker>-<instance>: several processes of one instance share its
	// work, JetStream redelivers what a dead process held, and operators
	// pause it and read its backlog from the consumer. Every instance
	// costs the server a consumer.
	ReadConsumer ReadMode = iota
	// ReadStream reads the instance's subjects straight from the stream,
	// by sequence, with no consumer at all: a core NATS subscription on
	// its own subjects wakes it when an event is stored, and it reads
	// what was stored after its cursor (the last sequence it has settled
	// everything up to, kept in the checkpoint bucket). An idle instance
	// costs the server one subscription. It is for fleets of host-bound
	// instances, each run by one process: two processes of one instance
	// would both run its events (the checkpoint keeps a key from moving
	// back, but a handler may run twice).
	ReadStream
)

// String names the mode as --read-mode takes it.
func (m ReadMode) String() string {
	if m == ReadStream {
		return "stream"
	}
	return "consumer"
}

// defaultResync is how often a stream-reading instance reads its subjects
// again with nothing to wake it: what covers a wake-up lost while the
// connection was down. A reconnect reads them at once too.
const defaultResync = 5 * time.Minute

// streamReader is the source of a ReadStream instance: it reads the
// instance's subjects from the stream by sequence, woken by a subscription,
// keeps its cursor in the bucket, and stands each event it reads in for a
// delivery (storedMsg). It knows what it read and not yet settled, and how
// far each subject has been read.
type streamReader struct {
	*instance
	// accept queues a message it read behind its key (Runtime.accept).
	accept  func(jetstream.Msg, *jetstream.MsgMetadata) (run func())
	runners *runners
	// stream and store are bound by ensure.
	stream jetstream.Stream
	store  *events.Store
	// err is why the last read stopped, when it was not asked to.
	err error

	mu      sync.Mutex
	scanned map[string]uint64 // per subject, the last sequence read
	pending map[uint64]string // read and not settled yet: sequence to subject
	saved   map[string]uint64 // the cursor last written
	rev     uint64
	// savedAt is when the cursor was last written; quietTimer signals
	// quiet once the reader has been quiet for cursorQuiet.
	savedAt    time.Time
	quietTimer *time.Timer
	quiet      chan struct{}
	wake       chan struct{}
	// save is signalled when nothing read is left unsettled, so the
	// cursor is written without waiting for the next read.
	save chan struct{}
}

// cursor is what may be written as the cursor: per subject, one below the
// lowest sequence still pending there, or the last sequence read.
func (sr *streamReader) cursor() map[string]uint64 {
	c := maps.Clone(sr.scanned)
	for seq, subj := range sr.pending {
		if seq-1 < c[subj] {
			c[subj] = seq - 1
		}
	}
	return c
}

func (sr *streamReader) signal() {
	select {
	case sr.wake <- struct{}{}:
	default:
	}
}

// settled notes that the event at seq is settled; released, that it was
// handed back unsettled (at shutdown, or when it could not be settled),
// so it is read again.
func (sr *streamReader) settled(seq uint64) {
	sr.mu.Lock()
	delete(sr.pending, seq)
	idle := len(sr.pending) == 0
	sr.mu.Unlock()
	if idle {
		select {
		case sr.save <- struct{}{}:
		default:
		}
	}
}

func (sr *streamReader) released(seq uint64) {
	sr.mu.Lock()
	if subj, ok := sr.pending[seq]; ok && sr.scanned[subj] >= seq {
		sr.scanned[subj] = seq - 1
	}
	delete(sr.pending, seq)
	sr.mu.Unlock()
}

// storedMsg is an event read from the stream by sequence, standing in for a
// consumer's delivery: settling it settles the reader's cursor, and what
// JetStream would do for a consumer (redelivery, AckWait) the reader does
// by reading again.
type storedMsg struct {
	raw *jetstream.RawStreamMsg
	r   *streamReader
}

func (m *storedMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{
		Sequence:     jetstream.SequencePair{Stream: m.raw.Sequence},
		NumDelivered: 1,
		Timestamp:    m.raw.Time,
		Stream:       events.StreamEvents,
	}, nil
}

func (m *storedMsg) Data() []byte                       { return m.raw.Data }
func (m *storedMsg) Headers() nats.Header               { return m.raw.Header }
func (m *storedMsg) Subject() string                    { return m.raw.Subject }
func (m *storedMsg) Reply() string                      { return "" }
func (m *storedMsg) Ack() error                         { m.r.settled(m.raw.Sequence); return nil }
func (m *storedMsg) DoubleAck(context.Context) error    { return m.Ack() }
func (m *storedMsg) Term() error                        { return m.Ack() }
func (m *storedMsg) TermWithReason(string) error        { return m.Ack() }
func (m *storedMsg) InProgress() error                  { return nil }
func (m *storedMsg) Nak() error                         { m.r.released(m.raw.Sequence); return nil }
func (m *storedMsg) NakWithDelay(d time.Duration) error { return m.later(d) }

// later reads the event again after d, as a consumer's delayed redelivery
// would deliver it.
func (m *storedMsg) later(d time.Duration) error {
	m.r.released(m.raw.Sequence)
	time.AfterFunc(d, m.r.signal)
	return nil
}

// cursorKey is where an instance's cursor is kept (events.CursorKey).
func (sr *streamReader) cursorKey() string { return events.CursorKey(sr.spec.Name, sr.spec.Instance) }

// readPause reads the instance's pause: the time it ends, or the zero
// time. Only an operator's signature makes a pause: one that does not
// verify is ignored (and reported by the store), so a forged pause cannot
// hold the instance off its events.
func (sr *streamReader) readPause(ctx context.Context) (time.Time, error) {
	doc, err := sr.store.Get(ctx, events.PauseKey(sr.spec.Name, sr.spec.Instance))
	if err != nil {
		return time.Time{}, fmt.Errorf("read the pause of %s: %w", sr.consumerName(), err)
	}
	var p events.Pause
	if err := doc.Decode(&p); err != nil {
		return time.Time{}, fmt.Errorf("%w; resume it to clear it", err)
	}
	return p.Until, nil
}

// woken refuses a stream whose stored notices do not cover every subject
// of the instance: the reader wakes on nothing else (a subscriber to the
// event subject itself could hear of an event before it is stored, and a
// host's permissions allow only its notices), so it would read only at
// its resyncs, minutes apart.
func (sr *streamReader) woken() error {
	rp := sr.stream.CachedInfo().Config.RePublish
	for _, subj := range sr.spec.Subjects {
		if rp != nil && events.NoticesCover(rp.Source, subj) {
			continue
		}
		covered := "no event"
		if rp != nil {
			covered = "only " + rp.Source
		}
		return fmt.Errorf("%s cannot read %s in stream mode: %s sends stored notices of %s (steward setup --stored-notices), and a stream-reading instance is woken by nothing else; run `steward setup --stored-notices %s` (the default) as the operator, or run the instance with --read-mode consumer",
			sr.consumerName(), subj, events.StreamEvents, covered, events.DefaultNotices)
	}
	return nil
}

// subscribe listens for what wakes the reader: the stored notices of its
// subjects (woken checked at start that the stream sends them) and its
// control subject, whose messages come on control.
func (sr *streamReader) subscribe(nc *nats.Conn) (control <-chan struct{}, unsubscribe func(), err error) {
	wake := func(*nats.Msg) { sr.signal() }
	ch := make(chan struct{}, 1)
	var subs []*nats.Subscription
	unsubscribe = func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}
	csub, err := nc.Subscribe(events.ControlSubject(sr.spec.Name, sr.spec.Instance), func(*nats.Msg) {
		select {
		case ch <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return nil, nil, fmt.Errorf("subscribe to the control subject of %s: %w", sr.consumerName(), err)
	}
	subs = append(subs, csub)
	for _, subj := range sr.spec.Subjects {
		on := events.StoredSubject(subj)
		sub, err := nc.Subscribe(on, wake)
		if err != nil {
			unsubscribe()
			return nil, nil, fmt.Errorf("subscribe to %s for worker %s: %w", on, sr.consumerName(), err)
		}
		subs = append(subs, sub)
	}
	return ch, unsubscribe, nil
}

// paused reads the instance's pause and returns when it ends (the zero
// time: not paused), logging a pause or a resume that is news against was,
// what the last read said. A pause that cannot be read does not hold the
// reader.
func (sr *streamReader) paused(ctx context.Context, was time.Time) time.Time {
	until, err := sr.readPause(ctx)
	if err != nil {
		sr.log.Warn().Err(err).Msg("the pause could not be read; reading as if not paused")
		until = time.Time{}
	}
	if until.After(sr.now()) {
		if !until.Equal(was) {
			sr.log.Info().Time("until", until).Msg("paused: reading nothing until then")
			time.AfterFunc(until.Sub(sr.now()), sr.signal)
		}
	} else if !was.IsZero() {
		sr.log.Info().Msg("resumed")
	}
	return until
}

// run reads the instance's subjects from the stream until ctx ends: at
// start, whenever a stored notice says something was stored on them, on a
// reconnect, and every resync interval.
func (sr *streamReader) run(ctx context.Context) error {
	nc := sr.js.Conn()
	control, unsubscribe, err := sr.subscribe(nc)
	if err != nil {
		return err
	}
	defer unsubscribe()
	// The pause is read before every read of the stream (one get of a
	// small document), so a pause holds from the moment it is written;
	// the control subject only wakes the reader when a pause ends.
	var pausedUntil time.Time
	if err := sr.loadCursor(ctx); err != nil {
		return err
	}
	// Spread the fleet's resyncs, so ten thousand hosts do not read at once.
	resync := time.NewTimer(sr.o.resync/2 + rand.N(sr.o.resync))
	defer resync.Stop()
	// A wake-up published while the connection was down is lost: a
	// reconnect reads again. The connection's count is local, so checking
	// it costs the server nothing (its reconnect handler is the owner's).
	reconnects := nc.Stats().Reconnects
	check := time.NewTicker(time.Second)
	defer check.Stop()
	// A new subscription's interest reaches the other servers of a
	// cluster a moment later, and a notice published meanwhile is not
	// heard: read now, and again shortly, so an event stored in that
	// moment waits seconds, not a resync.
	if err := nc.Flush(); err != nil {
		sr.log.Debug().Err(err).Msg("flush after subscribing")
	}
	sr.signal()
	for _, d := range []time.Duration{time.Second, 5 * time.Second} {
		t := time.AfterFunc(d, sr.signal)
		defer t.Stop()
	}
	for {
		select {
		case <-ctx.Done():
			// Stopping: written now, so a restart reads from here.
			sr.writeCursor(context.WithoutCancel(ctx))
			return nil
		case <-sr.quiet:
			sr.writeCursor(ctx)
			continue
		case <-sr.wake:
		case <-control:
		case <-sr.save:
			sr.saveCursor(ctx)
			continue
		case <-check.C:
			n := nc.Stats().Reconnects
			if n == reconnects {
				continue
			}
			// Read again now and once the subscriptions' interest has
			// spread again, for the same reason as at start.
			reconnects = n
			time.AfterFunc(5*time.Second, sr.signal)
		case <-resync.C:
			resync.Reset(sr.o.resync)
		}
		if pausedUntil = sr.paused(ctx, pausedUntil); pausedUntil.After(sr.now()) {
			continue
		}
		if err := sr.scan(ctx); err != nil {
			if ctx.Err() != nil {
				continue
			}
			sr.log.Warn().Err(err).Msg("reading the stream failed; reading again shortly")
			time.AfterFunc(time.Second, sr.signal)
			continue
		}
		sr.saveCursor(ctx)
	}
}

// scan reads every event stored on the instance's subjects after what was
// read, and hands each to the lanes as a delivery would be.
func (sr *streamReader) scan(ctx context.Context) error {
	for _, subj := range sr.spec.Subjects {
		for {
			sr.mu.Lock()
			from := sr.scanned[subj] + 1
			sr.mu.Unlock()
			gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			m, err := sr.stream.GetMsg(gctx, from, jetstream.WithGetMsgSubject(subj))
			cancel()
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			if err != nil {
				return fmt.Errorf("read %s after sequence %d: %w", subj, from-1, err)
			}
			sr.mu.Lock()
			sr.scanned[subj] = m.Sequence
			sr.pending[m.Sequence] = subj
			sr.mu.Unlock()
			msg := &storedMsg{raw: m, r: sr}
			meta, _ := msg.Metadata()
			if run := sr.accept(msg, meta); run != nil {
				sr.runners.run(run)
			}
		}
	}
	return nil
}

// loadCursor reads the cursor; without one, an instance upgraded from
// ReadConsumer starts after its old consumer's ack floor (everything at or
// below it was settled), and a new one at the start of the stream (the
// checkpoints skip what was already applied).
func (sr *streamReader) loadCursor(ctx context.Context) error {
	doc, err := sr.store.Get(ctx, sr.cursorKey())
	switch {
	case err != nil:
		return fmt.Errorf("read the cursor of %s: %w", sr.consumerName(), err)
	case doc.Trusted:
		var c events.Cursor
		if err := doc.Decode(&c); err != nil {
			return fmt.Errorf("%w; delete it to read the stream from the start, the checkpoints skip what was applied", err)
		}
		sr.mu.Lock()
		for subj, seq := range c.Subjects {
			if slices.Contains(sr.spec.Subjects, subj) {
				sr.scanned[subj] = seq
			}
		}
		sr.saved, sr.rev = maps.Clone(sr.scanned), doc.Revision
		sr.mu.Unlock()
		return nil
	case doc.Present():
		// A cursor that does not verify is not believed: the subjects
		// are read again, and the keys' own checkpoints skip what was
		// applied.
		return sr.rereadFrom(ctx)
	}
	return sr.adoptConsumer(ctx)
}

// rereadFrom places the reader after a cursor that did not verify. It
// re-reads what the keys need and no more, so a forgery across a whole
// fleet is no thundering herd: under latest-wins, a subject of the
// instance's own (ending in its token) is read from its newest event, which
// supersedes every older one of its key anyway; any other subject is read
// from its start, and the keys' checkpoints skip what was applied.
func (sr *streamReader) rereadFrom(ctx context.Context) error {
	for _, subj := range sr.spec.Subjects {
		from := uint64(0)
		if sr.spec.Rank != nil && strings.HasSuffix(subj, "."+sr.spec.Instance) {
			m, err := sr.stream.GetLastMsgForSubject(ctx, subj)
			switch {
			case err == nil:
				from = m.Sequence - 1
			case !errors.Is(err, jetstream.ErrMsgNotFound):
				return fmt.Errorf("find the newest event of %s after the cursor of %s did not verify: %w", subj, sr.consumerName(), err)
			}
		}
		sr.mu.Lock()
		sr.scanned[subj] = from
		sr.mu.Unlock()
	}
	sr.log.Warn().Msg("the stream cursor does not verify as this instance's, so it is not believed: the subjects are read again, and each key's checkpoint skips what was applied")
	return nil
}

// adoptConsumer moves an instance from its durable consumer to the stream
// reader: the consumer's ack floor becomes the cursor of every subject,
// then the consumer is deleted, once, so it stops costing the server.
// Events after the floor are read again; those applied and not acked are
// skipped by their checkpoints, so nothing is lost or applied twice.
func (sr *streamReader) adoptConsumer(ctx context.Context) error {
	c, err := sr.js.Consumer(ctx, events.StreamEvents, sr.consumerName())
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up the consumer %s to move it to the stream reader: %w", sr.consumerName(), err)
	}
	floor := c.CachedInfo().AckFloor.Stream
	sr.mu.Lock()
	for _, subj := range sr.spec.Subjects {
		sr.scanned[subj] = floor
	}
	sr.mu.Unlock()
	if err := sr.saveCursorNow(ctx); err != nil {
		return err
	}
	if err := sr.js.DeleteConsumer(ctx, events.StreamEvents, sr.consumerName()); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("delete the consumer %s after moving to the stream reader (its cursor is saved, so it is safe to delete by hand): %w", sr.consumerName(), err)
	}
	sr.log.Info().Uint64("ack_floor", floor).Msg("moved from a durable consumer to the stream reader; the consumer is deleted")
	return nil
}

// The cursor only says where a restart reads from: one behind means
// reading again what the keys' checkpoints then skip. Each write is a
// synced write to the bucket, though, and a site catching up on 10,000
// queued events wrote 4,000 cursors before writes waited for a quiet
// moment (docs/benchmarks.md, "Sites"). So a reader writes its cursor
// once it has read nothing new and settled everything for cursorQuiet,
// and at least every cursorAtMost while it stays busy.
const (
	cursorQuiet  = time.Second
	cursorAtMost = 30 * time.Second
)

// saveCursor writes the cursor once the reader is quiet (cursorQuiet from
// now, unless it moves again meanwhile), or at once when the last write
// is cursorAtMost old.
func (sr *streamReader) saveCursor(ctx context.Context) {
	sr.mu.Lock()
	if sr.now().Sub(sr.savedAt) < cursorAtMost {
		if sr.quietTimer == nil {
			sr.quietTimer = time.AfterFunc(cursorQuiet, sr.quietNow)
		} else {
			sr.quietTimer.Reset(cursorQuiet)
		}
		sr.mu.Unlock()
		return
	}
	sr.mu.Unlock()
	sr.writeCursor(ctx)
}

// quietNow tells the reader it has been quiet for cursorQuiet.
func (sr *streamReader) quietNow() {
	select {
	case sr.quiet <- struct{}{}:
	default:
	}
}

// writeCursor writes the cursor when it moved; a failure is logged and the
// next save tries again (an old cursor only means reading more again).
func (sr *streamReader) writeCursor(ctx context.Context) {
	sr.mu.Lock()
	sr.savedAt = sr.now()
	sr.mu.Unlock()
	if err := sr.saveCursorNow(ctx); err != nil {
		sr.log.Debug().Err(err).Msg("cursor not saved; it is saved again later")
	}
}

func (sr *streamReader) saveCursorNow(ctx context.Context) error {
	sr.mu.Lock()
	c := sr.cursor()
	same := maps.Equal(c, sr.saved)
	rev := sr.rev
	sr.mu.Unlock()
	if same {
		return nil
	}
	// Only this process reads this instance, so the write is plain; the
	// revision is kept to say what was written, not to race anyone.
	next, err := sr.store.Set(ctx, sr.cursorKey(), events.Cursor{Subjects: c})
	if err != nil {
		return fmt.Errorf("save the cursor of %s: %w", sr.consumerName(), err)
	}
	_ = rev
	sr.mu.Lock()
	sr.saved, sr.rev = c, next
	sr.mu.Unlock()
	return nil
}
