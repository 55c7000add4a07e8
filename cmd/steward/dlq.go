package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"
	"unicode/utf8"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/streamread"
)

func newDLQCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "List, show and retry dead letters",
		Long: `Dead letters are events a worker could not apply, kept in STEWARD_DLQ with the
reason (Steward-Error), the worker (Steward-Worker), the original's stream,
sequence, subject and digest, and the number of deliveries. They are kept until
retried. Everything printed is taken from the bus, so control characters in it
are shown escaped (\x1b, \u202e), never sent to the terminal.`,
	}
	cmd.AddCommand(newDLQLsCmd(g), newDLQShowCmd(g), newDLQRetryCmd(g))
	return cmd
}

// dlqFilter selects dead letters. Listing and retrying both take one, so a
// new selection (by reason, key, age) is added here once and both commands
// get it.
type dlqFilter struct {
	// worker is a worker name (credential) or a consumer (credential-h1);
	// "" is every worker.
	worker string
	// seqs are STEWARD_DLQ sequences; nil is every letter.
	seqs []uint64
}

// match says whether the filter selects d. The worker is matched on the
// letter's Steward-Worker header, which a forged letter may set at will:
// retry checks it against the DLQ subject before it acts on it.
func (f dlqFilter) match(d events.DeadLetter) bool {
	if f.seqs != nil && !slices.Contains(f.seqs, d.DLQSequence) {
		return false
	}
	w := d.Worker
	return f.worker == "" || w == f.worker || strings.HasPrefix(w, f.worker+"-")
}

// readDLQ returns the dead letters the filter selects, in DLQ order. A
// filter of sequences reads only those.
func readDLQ(ctx context.Context, js jetstream.JetStream, f dlqFilter) ([]events.DeadLetter, error) {
	if f.seqs != nil {
		var out []events.DeadLetter
		for _, seq := range f.seqs {
			d, err := getDeadLetter(ctx, js, seq)
			if err != nil {
				return nil, err
			}
			if f.match(d) {
				out = append(out, d)
			}
		}
		return out, nil
	}
	var out []events.DeadLetter
	err := streamread.Each(ctx, js, streamread.Range{Stream: events.StreamDLQ}, func(m jetstream.Msg) error {
		meta, err := m.Metadata()
		if err != nil {
			return err
		}
		d := events.ParseDeadLetter(meta.Sequence.Stream, m.Subject(), m.Headers(), m.Data())
		if f.match(d) {
			out = append(out, d)
		}
		return nil
	})
	return out, err
}

func getDeadLetter(ctx context.Context, js jetstream.JetStream, seq uint64) (events.DeadLetter, error) {
	s, err := js.Stream(ctx, events.StreamDLQ)
	if err != nil {
		return events.DeadLetter{}, fmt.Errorf("stream %s: %w", events.StreamDLQ, err)
	}
	m, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return events.DeadLetter{}, fmt.Errorf("no dead letter at %s sequence %d (it may have been retried already; see steward dlq ls)", events.StreamDLQ, seq)
	}
	if err != nil {
		return events.DeadLetter{}, fmt.Errorf("dead letter %d: %w", seq, err)
	}
	return events.ParseDeadLetter(m.Sequence, m.Subject, m.Header, m.Data), nil
}

func parseDLQSeq(arg string) (uint64, error) {
	seq, err := strconv.ParseUint(arg, 10, 64)
	if err != nil || seq == 0 {
		return 0, fmt.Errorf("%s is not a %s sequence (see steward dlq ls)", strconv.Quote(arg), events.StreamDLQ)
	}
	return seq, nil
}

func newDLQLsCmd(g *globals) *cobra.Command {
	var f dlqFilter
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List dead letters: sequence, worker, subject, deliveries, event id, reason",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			nc, js, err := g.connect(cmd.Context(), "steward dlq", false)
			if err != nil {
				return err
			}
			defer nc.Close()
			list, err := readDLQ(cmd.Context(), js, f)
			if err != nil {
				return err
			}
			listDeadLetters(cmd.OutOrStdout(), list)
			fmt.Fprintf(cmd.ErrOrStderr(), "%d dead letters\n", len(list))
			return nil
		},
	}
	cmd.Flags().StringVar(&f.worker, "worker", "", "only this worker: a name (credential) or a consumer (credential-h1)")
	return cmd
}

// listDeadLetters prints one row per letter. Every field comes from the
// bus, so each is escaped: a tab would break the columns and an escape
// sequence would drive the terminal.
func listDeadLetters(w io.Writer, list []events.DeadLetter) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tWORKER\tSUBJECT\tDELIVERIES\tEVENT\tREASON")
	for _, d := range list {
		id := d.EventID()
		if id == "" {
			id = "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\n", d.DLQSequence, terminalSafe(d.Worker), terminalSafe(d.Subject), d.Delivered, terminalSafe(id), terminalSafe(d.Reason))
	}
	_ = tw.Flush()
}

func newDLQShowCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "show <seq>",
		Short: "Show one dead letter: its headers and data",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			seq, err := parseDLQSeq(args[0])
			if err != nil {
				return err
			}
			nc, js, err := g.connect(cmd.Context(), "steward dlq", false)
			if err != nil {
				return err
			}
			defer nc.Close()
			d, err := getDeadLetter(cmd.Context(), js, seq)
			if err != nil {
				return err
			}
			showDeadLetter(cmd.OutOrStdout(), d)
			return nil
		},
	}
}

func showDeadLetter(w io.Writer, d events.DeadLetter) {
	fmt.Fprintf(w, "sequence: %d\nsubject: %s\n", d.DLQSequence, terminalSafe(d.DLQSubject))
	if d.Truncated {
		fmt.Fprintf(w, "truncated: the letter holds %d of the original's %d bytes; the original is %s sequence %d\n", len(d.Data), d.OriginalSize, d.Stream, d.Sequence)
	}
	fmt.Fprintln(w, "headers:")
	names := make([]string, 0, len(d.Headers))
	for k := range d.Headers {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		for _, v := range d.Headers[k] {
			fmt.Fprintf(w, "  %s: %s\n", terminalSafe(k), terminalSafe(v))
		}
	}
	fmt.Fprintln(w, "data:")
	var pretty bytes.Buffer
	if !d.Truncated && json.Indent(&pretty, d.Data, "  ", "  ") == nil {
		// Valid JSON may still carry raw C1 controls and bidi overrides
		// inside its strings: escape each line.
		for _, line := range strings.Split(pretty.String(), "\n") {
			fmt.Fprintf(w, "  %s\n", terminalSafe(line))
		}
	} else {
		fmt.Fprintf(w, "  %s\n", terminalSafe(strconv.Quote(string(d.Data))))
	}
}

// terminalSafe escapes what a terminal would act on rather than show: C0
// and C1 controls (ESC starts cursor moves and OSC 52 clipboard writes),
// DEL, Unicode format characters (bidi overrides that reorder a line),
// line and paragraph separators, and bytes that are not UTF-8. The result
// is one line of printable text.
func terminalSafe(s string) string {
	clean := true
	for _, r := range s {
		if unsafeRune(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r < 0x80 && unsafeRune(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case unsafeRune(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

func unsafeRune(r rune) bool {
	return r == utf8.RuneError || r < 0x20 || (r >= 0x7f && r < 0xa0) ||
		unicode.Is(unicode.Cf, r) || unicode.Is(unicode.Zl, r) || unicode.Is(unicode.Zp, r)
}

func newDLQRetryCmd(g *globals) *cobra.Command {
	var f dlqFilter
	var all bool
	cmd := &cobra.Command{
		Use:   "retry [<seq>]",
		Short: "Republish dead letters to the subject their event belongs on, then remove them",
		Long: `Republish a dead letter (or, with --all, every dead letter of --worker) and then
delete it from STEWARD_DLQ. The event is decoded from the letter (or, for a
letter kept by reference, read from STEWARD_EVENTS and checked against the
letter's digest), validated again, and published to the subject its type and
key map to, never to a subject the letter names. A letter whose worker and DLQ
subject disagree, that was altered, or whose event is still invalid is refused
and kept. When JetStream reports the republish as a duplicate of something
other than this event, nothing was stored, so the letter is kept.

Every consumer of that subject sees the event again as a new stream message;
the handlers' idempotency keeps that safe. Fix what the reason names first, or
the event comes back.`,
		Example: `  steward dlq retry 12
  steward dlq retry --worker credential-h1 --all`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (len(args) == 1) == all {
				return errors.New("give one sequence, or --all with --worker")
			}
			if all && f.worker == "" {
				return errors.New("--all needs --worker: retrying every worker's dead letters at once is rarely meant")
			}
			if !all {
				seq, err := parseDLQSeq(args[0])
				if err != nil {
					return err
				}
				f.seqs = []uint64{seq}
			}
			ctx := cmd.Context()
			nc, js, err := g.connect(ctx, "steward dlq", false)
			if err != nil {
				return err
			}
			defer nc.Close()
			list, err := readDLQ(ctx, js, f)
			if err != nil {
				return err
			}
			return retryAll(ctx, js, list, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	cmd.Flags().StringVar(&f.worker, "worker", "", "the worker whose dead letters --all retries: a name or a consumer")
	cmd.Flags().BoolVar(&all, "all", false, "retry every dead letter of --worker")
	return cmd
}

// retryAll retries each letter, going on past a refused one so that one
// bad letter does not hold up the others, and fails at the end if any was
// refused.
func retryAll(ctx context.Context, js jetstream.JetStream, list []events.DeadLetter, out, errOut io.Writer) error {
	refused := 0
	for _, d := range list {
		r, err := retryDeadLetter(ctx, js, d)
		if err != nil {
			refused++
			fmt.Fprintf(errOut, "refused: %s\n", terminalSafe(err.Error()))
			continue
		}
		note := ""
		if r.already {
			note = " (stored by an earlier retry; the letter is now removed)"
		}
		fmt.Fprintf(out, "retried dlq seq=%d id=%s worker=%s subject=%s new-seq=%d%s\n",
			d.DLQSequence, terminalSafe(r.event.ID()), terminalSafe(d.Worker), r.subject, r.seq, note)
	}
	fmt.Fprintf(errOut, "%d dead letters retried\n", len(list)-refused)
	if refused > 0 {
		return fmt.Errorf("%d of %d dead letters were refused and kept in %s; fix what each refusal names, then retry them", refused, len(list), events.StreamDLQ)
	}
	return nil
}

// retried is what a retry did.
type retried struct {
	event   event.Event
	subject string
	seq     uint64
	// already says the republish was a duplicate of this same event,
	// stored by an earlier retry that stopped before deleting the letter.
	already bool
}

// forbiddenPrefixes are subjects a retry never publishes to, whatever the
// event says: the JetStream and KV APIs, reply inboxes and the system
// account. The subject is derived from a validated event and always starts
// with steward.events., so this is a second lock, not the first.
var forbiddenPrefixes = []string{"$JS.", "$KV.", "$SYS.", "$O.", "_INBOX."}

// retryDeadLetter republishes the event of d to the subject that event
// maps to and then deletes d. Its Nats-Msg-Id is derived from the letter's
// sequence and digest, so running the retry again after a crash between
// the two steps stores the event once (inside the dedupe window) and then
// deletes the letter.
func retryDeadLetter(ctx context.Context, js jetstream.JetStream, d events.DeadLetter) (retried, error) {
	e, digest, err := letterEvent(ctx, js, d)
	if err != nil {
		return retried{}, err
	}
	k, _ := events.Lookup(e.Type())
	subject, err := k.SubjectFor(e.Subject())
	if err != nil {
		return retried{}, fmt.Errorf("dead letter %d: the event's key has no subject: %w; it was left in the DLQ", d.DLQSequence, err)
	}
	if !strings.HasPrefix(subject, events.EventsPrefix+".") || slices.ContainsFunc(forbiddenPrefixes, func(p string) bool { return strings.HasPrefix(subject, p) }) {
		return retried{}, fmt.Errorf("dead letter %d maps to %s, outside %s.>; it was left in the DLQ", d.DLQSequence, subject, events.EventsPrefix)
	}
	msg, err := events.Encode(subject, e)
	if err != nil {
		return retried{}, fmt.Errorf("dead letter %d: %w; it was left in the DLQ", d.DLQSequence, err)
	}
	id := retryMsgID(d.DLQSequence, digest)
	msg.Header.Set(nats.MsgIdHdr, id)
	ack, err := js.PublishMsg(ctx, msg, jetstream.WithExpectStream(events.StreamEvents))
	if err != nil {
		return retried{}, fmt.Errorf("republish dead letter %d (event %s) to %s: %w; it was left in the DLQ", d.DLQSequence, e.ID(), subject, err)
	}
	r := retried{event: e, subject: subject, seq: ack.Sequence}
	if ack.Duplicate {
		// Nothing new was stored. Only if what JetStream holds under this
		// id is this very event may the letter go.
		if err := sameStored(ctx, js, ack.Sequence, id, msg); err != nil {
			return retried{}, fmt.Errorf("dead letter %d (event %s): JetStream reports the republish as a duplicate of %s sequence %d, and %w: nothing was stored, so the letter is kept; retry it again after the %s dedupe window", d.DLQSequence, e.ID(), events.StreamEvents, ack.Sequence, err, events.StreamEvents)
		}
		r.already = true
	}
	s, err := js.Stream(ctx, events.StreamDLQ)
	if err == nil {
		err = s.DeleteMsg(ctx, d.DLQSequence)
	}
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return retried{}, fmt.Errorf("dead letter %d was republished at %s sequence %d but could not be deleted from the DLQ: %w; retry it again (within the dedupe window the event is not stored twice)", d.DLQSequence, events.StreamEvents, ack.Sequence, err)
	}
	return r, nil
}

// retryMsgID is the Nats-Msg-Id of a retry of the letter at dlqSeq.
func retryMsgID(dlqSeq uint64, digest string) string {
	d := strings.TrimPrefix(digest, "sha256:")
	if len(d) > 32 {
		d = d[:32]
	}
	return "steward-dlq-retry-" + strconv.FormatUint(dlqSeq, 10) + "-" + d
}

// letterEvent is the event a retry republishes, with the digest of the
// original it came from: the letter's own event when the letter is whole
// and matches its digest, or the original read by reference when the
// letter is truncated. The event is validated again, as a publisher would.
func letterEvent(ctx context.Context, js jetstream.JetStream, d events.DeadLetter) (event.Event, string, error) {
	if err := d.CheckWorker(); err != nil {
		return event.Event{}, "", fmt.Errorf("%w; it was left in the DLQ (delete it once you know who wrote it)", err)
	}
	var e event.Event
	digest := d.Digest
	switch {
	case d.Truncated:
		orig, err := originalOf(ctx, js, d)
		if err != nil {
			return event.Event{}, "", err
		}
		e = orig
	case d.Event == nil:
		return event.Event{}, "", fmt.Errorf("dead letter %d does not hold a readable CloudEvent (it may be why it is dead): there is nothing to republish; publish a corrected event with steward publish, then delete the letter", d.DLQSequence)
	default:
		if err := d.Verify(); err != nil && !errors.Is(err, events.ErrLetterUnverifiable) {
			return event.Event{}, "", fmt.Errorf("dead letter %d: %w; it was left in the DLQ", d.DLQSequence, err)
		}
		if digest == "" {
			// Written before letters carried digests.
			digest = events.LetterDigest(d.Subject, d.Headers, d.Data)
		}
		e = *d.Event
	}
	if err := events.Validate(e); err != nil {
		return event.Event{}, "", fmt.Errorf("dead letter %d (event %s) is still not a valid event: %w; it was left in the DLQ: fix the publisher and publish a corrected event", d.DLQSequence, e.ID(), err)
	}
	return e, digest, nil
}

// originalOf reads the original of a letter kept by reference and checks
// it is the one the letter names.
func originalOf(ctx context.Context, js jetstream.JetStream, d events.DeadLetter) (event.Event, error) {
	if d.Stream != events.StreamEvents {
		return event.Event{}, fmt.Errorf("dead letter %d refers to stream %q, not %s; it was left in the DLQ", d.DLQSequence, d.Stream, events.StreamEvents)
	}
	s, err := js.Stream(ctx, events.StreamEvents)
	if err != nil {
		return event.Event{}, fmt.Errorf("dead letter %d: stream %s: %w", d.DLQSequence, events.StreamEvents, err)
	}
	m, err := s.GetMsg(ctx, d.Sequence)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return event.Event{}, fmt.Errorf("dead letter %d is kept by reference, and %s sequence %d is gone (past retention?): there is nothing to republish; it was left in the DLQ", d.DLQSequence, events.StreamEvents, d.Sequence)
	}
	if err != nil {
		return event.Event{}, fmt.Errorf("dead letter %d: read its original at %s sequence %d: %w", d.DLQSequence, events.StreamEvents, d.Sequence, err)
	}
	if err := d.VerifyOriginal(m.Subject, m.Header, m.Data); err != nil {
		return event.Event{}, fmt.Errorf("dead letter %d: %w; it was left in the DLQ", d.DLQSequence, err)
	}
	e, err := events.Decode(m.Header, m.Data)
	if err != nil {
		return event.Event{}, fmt.Errorf("dead letter %d: its original does not decode: %w; it was left in the DLQ", d.DLQSequence, err)
	}
	return e, nil
}

// sameStored checks that the message at seq in STEWARD_EVENTS is the
// republish msg under id: the same subject, id and encoded event.
func sameStored(ctx context.Context, js jetstream.JetStream, seq uint64, id string, msg *nats.Msg) error {
	s, err := js.Stream(ctx, events.StreamEvents)
	if err != nil {
		return fmt.Errorf("it could not be read back: %w", err)
	}
	m, err := s.GetMsg(ctx, seq)
	if err != nil {
		return fmt.Errorf("it could not be read back: %w", err)
	}
	if m.Subject != msg.Subject || m.Header.Get(nats.MsgIdHdr) != id || !bytes.Equal(m.Data, msg.Data) ||
		events.LetterDigest(m.Subject, m.Header, m.Data) != events.LetterDigest(msg.Subject, msg.Header, msg.Data) {
		return errors.New("the message stored there is not this event")
	}
	return nil
}
