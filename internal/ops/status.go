package ops

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/redact"
)

// DefaultLimit is how many instances a Status shows when the caller sets
// no limit: the worst ones, the rest counted.
const DefaultLimit = 20

// State is what an instance's status says in one word, worst first in
// Severity's order.
type State string

// The states of an instance.
const (
	// StateStalled: events are pending and nothing is consuming them.
	StateStalled State = "stalled"
	// StateRetrying: at least one key's event fails and is retried.
	StateRetrying State = "retrying"
	// StateNoConsumer: a status document says keys are stuck, but the
	// instance has no consumer (it was removed, or never made here).
	StateNoConsumer State = "no-consumer"
	// StateWaiting: a key's event waits behind an earlier one held by
	// another process.
	StateWaiting State = "waiting"
	// StateDeadLetters: dead letters of the instance wait for an operator
	// (`steward dlq ls`).
	StateDeadLetters State = "dead-letters"
	// StatePaused: an operator paused the consumer.
	StatePaused State = "paused"
	// StateNotConsuming: nothing is pending, but no process is pulling.
	StateNotConsuming State = "not-consuming"
	// StateBacklog: events are pending and a process is consuming them.
	StateBacklog State = "backlog"
	// StateOK: consuming, nothing pending, nothing stuck.
	StateOK State = "ok"
)

// States lists every state, worst first.
var States = []State{StateStalled, StateRetrying, StateNoConsumer, StateWaiting, StateDeadLetters,
	StatePaused, StateNotConsuming, StateBacklog, StateOK}

// Severity is s's place in States: lower is worse.
func (s State) Severity() int {
	if i := slices.Index(States, s); i >= 0 {
		return i
	}
	return len(States)
}

// StatusOptions selects what Status reports.
type StatusOptions struct {
	// Worker keeps only that worker's instances ("": every worker).
	Worker string
	// Instance keeps only that instance: its consumer name
	// (credential-hive-1) or its instance (hive-1).
	Instance string
	// Limit is how many instances Instances holds, worst first (0:
	// DefaultLimit; negative: all).
	Limit int
	// Now is the time ages are measured from (zero: time.Now()).
	Now time.Time
	// Docs reads the checkpoint bucket, verifying each status document
	// as its instance's (docs/design.md §7). Nil opens the bucket without
	// keys: documents are shown marked as not verified.
	Docs *events.Store
}

// Status is what `steward status` reports: the streams, and every worker
// instance summarised by state with the worst ones in detail.
type Status struct {
	// Server is the URL asked, ServerName and ServerVersion what it said.
	Server        string `json:"server"`
	ServerName    string `json:"serverName,omitempty"`
	ServerVersion string `json:"serverVersion,omitempty"`
	// ServerWarning, when set, says what in the server risks a loss and
	// what to do: a hub with sites on a nats-server older than
	// events.MinSiteServerVersion.
	ServerWarning string    `json:"serverWarning,omitempty"`
	Time          time.Time `json:"time"`
	Streams       []Stream  `json:"streams"`
	InstanceSummary
	// Sites are the sites set up at this hub (docs/design.md §9), each
	// with its link, its lag and its own instances; none at a bus that
	// has no sites.
	Sites []SiteStatus `json:"sites"`
}

// InstanceSummary is the worker instances of one JetStream domain: the
// hub's, or a site's.
type InstanceSummary struct {
	// Total is the number of instances matched; Counts counts them by
	// state (every state present, zero or not).
	Total  int           `json:"total"`
	Counts map[State]int `json:"counts"`
	// DeadLetters is the depth of STEWARD_DLQ for the instances matched.
	DeadLetters uint64 `json:"deadLetters"`
	// Backlog is the events of every instance matched not yet settled
	// (pending and unacknowledged), summed.
	Backlog uint64 `json:"backlog"`
	// Instances are the worst instances first, at most the limit; More is
	// how many matched beyond them.
	Instances []Instance `json:"instances"`
	More      int        `json:"more"`
}

func emptySummary() InstanceSummary {
	sum := InstanceSummary{Counts: map[State]int{}, Instances: []Instance{}}
	for _, s := range States {
		sum.Counts[s] = 0
	}
	return sum
}

// Stream is one of Steward's streams as the server holds it.
type Stream struct {
	Name      string `json:"name"`
	Missing   bool   `json:"missing,omitempty"`
	Messages  uint64 `json:"messages"`
	Bytes     uint64 `json:"bytes"`
	FirstSeq  uint64 `json:"firstSeq"`
	LastSeq   uint64 `json:"lastSeq"`
	Consumers int    `json:"consumers"`
}

// Instance is one worker instance: its consumer as the server holds it and
// its status document as the runtime wrote it.
type Instance struct {
	Name     string `json:"name"`
	Worker   string `json:"worker"`
	Instance string `json:"instance"`
	State    State  `json:"state"`
	// HasConsumer is false when only a status document was found.
	HasConsumer bool `json:"hasConsumer"`
	// Consuming says a process is pulling now (a pull request is waiting
	// at the server); PullsWaiting is how many are.
	Consuming    bool `json:"consuming"`
	PullsWaiting int  `json:"pullsWaiting"`
	// LastActive is the last delivery or acknowledgement, Created when the
	// consumer was made: together, since when it has (or has not) been
	// consumed.
	LastActive *time.Time `json:"lastActive,omitempty"`
	Created    *time.Time `json:"created,omitempty"`
	// Pending is events not yet delivered, AckPending delivered and not yet
	// settled, Redelivered delivered more than once and not yet settled.
	Pending     uint64 `json:"pending"`
	AckPending  int    `json:"ackPending"`
	Redelivered int    `json:"redelivered"`
	// OldestPending is when the oldest unsettled event was stored (only
	// for the instances shown in detail; OldestPendingSeconds its age).
	OldestPending        *time.Time `json:"oldestPending,omitempty"`
	OldestPendingSeconds float64    `json:"oldestPendingSeconds,omitempty"`
	// PausedUntil is set while an operator's pause holds.
	PausedUntil *time.Time `json:"pausedUntil,omitempty"`
	DeadLetters uint64     `json:"deadLetters"`
	// LastDeadLetter is the newest of them, with its reason (secrets
	// elided) and marked forged when it does not verify as the
	// instance's: why the instance has letters waiting, without a second
	// command (only for the instances shown in detail).
	LastDeadLetter *Letter `json:"lastDeadLetter,omitempty"`
	// Retrying and Waiting are the status document's keys, errors elided.
	Retrying []events.RetryingKey `json:"retrying"`
	Waiting  []events.WaitingKey  `json:"waiting"`
	// Forged counts, by kind, the documents of the instance's that did
	// not verify, as the instance reported them; Forgeries are the latest,
	// each with its key and, where the stored message says, the key it
	// was reflected from (which names the identity that did it).
	Forged    map[events.DocKind]uint64 `json:"forged,omitempty"`
	Forgeries []events.Forgery          `json:"forgeries,omitempty"`
	// StatusForged, when set, says the status document itself did not
	// verify as the instance's, and why: what it said is not shown.
	StatusForged string `json:"statusForged,omitempty"`
	// StatusUnverified says the status document was read without keys to
	// verify it with.
	StatusUnverified bool `json:"statusUnverified,omitempty"`
	// StatusUpdated, Process and Stopped say who wrote the status document
	// and when; Stopped means that process has shut down since.
	StatusUpdated *time.Time `json:"statusUpdated,omitempty"`
	Process       string     `json:"process,omitempty"`
	Stopped       bool       `json:"stopped,omitempty"`

	filters []string
	ackSeq  uint64
}

// lastLetter reads the newest dead letter of in, checked as ListLetters
// checks each; nil when it cannot be read (the status shows the count
// all the same, and steward dlq ls lists them).
func lastLetter(ctx context.Context, dlq jetstream.Stream, in Instance, p Proofs) *Letter {
	m, err := dlq.GetLastMsgForSubject(ctx, events.DLQSubject(in.Worker, in.Instance))
	if err != nil {
		return nil
	}
	l := LetterOf(m.Sequence, m.Subject, m.Time, m.Header, m.Data)
	l.Forged, l.Unverified = p.letter(l.Raw, m.Time)
	return &l
}

// Unsettled is every event the instance has not settled yet.
func (i Instance) Unsettled() uint64 { return i.Pending + uint64(i.AckPending) }

// GetStatus computes the status of the bus js is connected to. A server
// holding none of Steward's streams is a *NoStreamsError.
func GetStatus(ctx context.Context, js jetstream.JetStream, o StatusOptions) (*Status, error) {
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	st := &Status{Server: ServerURL(js), Time: now.UTC(), InstanceSummary: emptySummary(), Sites: []SiteStatus{}}
	if nc := js.Conn(); nc != nil {
		st.ServerName, st.ServerVersion = nc.ConnectedServerName(), nc.ConnectedServerVersion()
	}
	var evStream jetstream.Stream
	found := 0
	for _, name := range []string{events.StreamEvents, events.StreamOutcomes, events.StreamDLQ} {
		s, err := streamOrNone(ctx, js, name)
		if err != nil {
			return nil, err
		}
		if s == nil {
			st.Streams = append(st.Streams, Stream{Name: name, Missing: true})
			continue
		}
		found++
		info := s.CachedInfo()
		st.Streams = append(st.Streams, Stream{Name: name, Messages: info.State.Msgs, Bytes: info.State.Bytes,
			FirstSeq: info.State.FirstSeq, LastSeq: info.State.LastSeq, Consumers: info.State.Consumers})
		if name == events.StreamEvents {
			evStream = s
		}
	}
	if found == 0 {
		return nil, &NoStreamsError{Server: st.Server}
	}

	byName := map[string]*Instance{}
	var sites []Site
	if evStream != nil {
		var err error
		// The sites come with the instances, from the same listing.
		if sites, err = listInstances(ctx, evStream, byName); err != nil {
			return nil, err
		}
	}
	if err := readStatusDocs(ctx, js, o.Docs, o.Worker, byName); err != nil {
		return nil, err
	}
	if err := readDLQDepth(ctx, js, byName); err != nil {
		return nil, err
	}
	sum, err := summarize(ctx, js, evStream, byName, o, now, ProofsOf(o.Docs))
	if err != nil {
		return nil, err
	}
	st.InstanceSummary = sum
	if len(sites) > 0 {
		st.Sites = siteStatuses(ctx, js, sites, o, now)
		// A hub that sources across links on a server that skips a
		// message after a reset says so where its sites are read.
		if err := events.CheckSiteServer("the hub", st.Server, st.ServerVersion); err != nil {
			st.ServerWarning = err.Error()
		}
	}
	return st, nil
}

// summarize classifies the instances of one domain (js, its STEWARD_EVENTS
// evStream when it has one), counts them by state, and keeps the worst up
// to o's limit; only those cost a request each, for the stored time of
// their oldest unsettled event and their newest dead letter, checked with
// proofs.
func summarize(ctx context.Context, js jetstream.JetStream, evStream jetstream.Stream, byName map[string]*Instance, o StatusOptions, now time.Time, proofs Proofs) (InstanceSummary, error) {
	sum := emptySummary()
	list := make([]Instance, 0, len(byName))
	for _, in := range byName {
		if !o.matches(*in) {
			continue
		}
		in.State = classify(*in)
		list = append(list, *in)
	}
	slices.SortFunc(list, func(a, b Instance) int {
		return cmp.Or(cmp.Compare(a.State.Severity(), b.State.Severity()),
			cmp.Compare(b.Unsettled(), a.Unsettled()), cmp.Compare(b.DeadLetters, a.DeadLetters),
			strings.Compare(a.Name, b.Name))
	})
	sum.Total = len(list)
	for _, in := range list {
		sum.Counts[in.State]++
		sum.DeadLetters += in.DeadLetters
		sum.Backlog += in.Unsettled()
	}
	limit := o.Limit
	if limit == 0 {
		limit = DefaultLimit
	}
	if limit > 0 && len(list) > limit {
		sum.More = len(list) - limit
		list = list[:limit]
	}
	var dlq jetstream.Stream
	if slices.ContainsFunc(list, func(in Instance) bool { return in.DeadLetters > 0 }) {
		var err error
		if dlq, err = streamOrNone(ctx, js, events.StreamDLQ); err != nil {
			return sum, err
		}
		if dlq != nil {
			proofs = proofs.sourcedBy(dlq.CachedInfo())
		}
	}
	for i := range list {
		if evStream != nil && list[i].Unsettled() > 0 {
			if t, ok := oldestUnsettled(ctx, evStream, list[i]); ok {
				list[i].OldestPending = &t
				list[i].OldestPendingSeconds = now.Sub(t).Seconds()
			}
		}
		if dlq != nil && list[i].DeadLetters > 0 {
			list[i].LastDeadLetter = lastLetter(ctx, dlq, list[i], proofs)
		}
	}
	sum.Instances = list
	return sum, nil
}

func (o StatusOptions) matches(in Instance) bool {
	if o.Worker != "" && in.Worker != o.Worker {
		return false
	}
	if o.Instance != "" && in.Name != o.Instance && in.Instance != o.Instance {
		return false
	}
	return true
}

// classify says an instance's state from what the server and its status
// document say, the most urgent first.
func classify(in Instance) State {
	live := !in.Stopped
	switch {
	case !in.HasConsumer && live && len(in.Retrying)+len(in.Waiting) > 0:
		return StateNoConsumer
	case !in.HasConsumer && in.DeadLetters > 0:
		return StateDeadLetters
	case !in.HasConsumer:
		return StateNotConsuming
	case in.PausedUntil != nil:
		return StatePaused
	case live && len(in.Retrying) > 0:
		return StateRetrying
	case in.Unsettled() > 0 && !in.Consuming:
		return StateStalled
	case live && len(in.Waiting) > 0:
		return StateWaiting
	case in.DeadLetters > 0:
		return StateDeadLetters
	case !in.Consuming:
		return StateNotConsuming
	case in.Unsettled() > 0:
		return StateBacklog
	}
	return StateOK
}

// listInstances reads every consumer the runtime created on STEWARD_EVENTS
// with one paged listing: never a consumer info per instance. The hub's
// consumers for its sites are in the same listing, and returned.
func listInstances(ctx context.Context, s jetstream.Stream, byName map[string]*Instance) ([]Site, error) {
	infos, err := listConsumers(ctx, s, events.StreamEvents)
	if err != nil {
		return nil, err
	}
	var sites []Site
	for _, info := range infos {
		if site, ok := siteOf(info); ok {
			sites = append(sites, site)
			continue
		}
		worker, instance, ok := SplitConsumer(info.Name, info.Config.Description)
		if !ok {
			continue
		}
		in := &Instance{Name: info.Name, Worker: worker, Instance: instance, HasConsumer: true,
			PullsWaiting: info.NumWaiting, Consuming: info.NumWaiting > 0 || info.PushBound,
			Pending: info.NumPending, AckPending: info.NumAckPending, Redelivered: info.NumRedelivered,
			Retrying: []events.RetryingKey{}, Waiting: []events.WaitingKey{},
			filters: info.Config.FilterSubjects, ackSeq: info.AckFloor.Stream}
		if len(in.filters) == 0 && info.Config.FilterSubject != "" {
			in.filters = []string{info.Config.FilterSubject}
		}
		created := info.Created.UTC()
		in.Created = &created
		in.LastActive = latest(info.Delivered.Last, info.AckFloor.Last)
		if info.Paused && info.Config.PauseUntil != nil {
			until := info.Config.PauseUntil.UTC()
			in.PausedUntil = &until
		}
		byName[in.Name] = in
	}
	return sites, nil
}

func latest(ts ...*time.Time) *time.Time {
	var out *time.Time
	for _, t := range ts {
		if t != nil && !t.IsZero() && (out == nil || t.After(*out)) {
			u := t.UTC()
			out = &u
		}
	}
	return out
}

// readStatusDocs reads every status document (rt.<worker>.<instance>) with
// one watch of the bucket's current values, each verified as its
// instance's: one that is not is listed as forged, never as fact.
func readStatusDocs(ctx context.Context, js jetstream.JetStream, docs *events.Store, worker string, byName map[string]*Instance) error {
	if docs == nil {
		kv, err := js.KeyValue(ctx, events.CheckpointBucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("open bucket %s: %w", events.CheckpointBucket, err)
		}
		docs = events.NewStore(kv, events.StoreOptions{})
	}
	pauses := events.PauseKey("*", "*")
	if worker != "" {
		pauses = events.PauseKey(worker, "*")
	}
	// The stream readers' pauses are read in the same watch: a paused
	// instance is shown, and a forged pause is shown as forged.
	w, err := docs.KV().WatchFiltered(ctx, []string{events.StatusFilter(worker), pauses}, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("read the status documents in %s: %w", events.CheckpointBucket, err)
	}
	defer w.Stop()
	for {
		var entry jetstream.KeyValueEntry
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, open := <-w.Updates():
			if !open {
				return errors.New("the watch of the status documents ended before it had read them all")
			}
			entry = e
		}
		if entry == nil {
			return nil // every current value has been read
		}
		d := docs.Open(ctx, entry)
		if d.Info.Kind != events.KindStatus && d.Info.Kind != events.KindPause {
			continue
		}
		name := ConsumerName(d.Info.Worker, d.Info.Instance)
		in, ok := byName[name]
		if !ok {
			in = &Instance{Name: name, Worker: d.Info.Worker, Instance: d.Info.Instance, Retrying: []events.RetryingKey{}, Waiting: []events.WaitingKey{}}
			byName[name] = in
		}
		if d.Forgery != nil {
			if d.Info.Kind == events.KindStatus {
				in.StatusForged = redact.Secrets(d.Forgery.Reason)
			}
			in.Forgeries = append(in.Forgeries, *d.Forgery)
			continue
		}
		if d.Info.Kind == events.KindPause {
			var p events.Pause
			if d.Decode(&p) == nil && p.Until.After(time.Now()) {
				until := p.Until.UTC()
				in.PausedUntil = &until
			}
			continue
		}
		var doc events.Status
		if err := d.Decode(&doc); err != nil || doc.Worker != d.Info.Worker || doc.Instance != d.Info.Instance {
			continue // not a status document this version can read
		}
		in.StatusUnverified = d.Unverified
		in.Retrying, in.Waiting = doc.Retrying, doc.Waiting
		if in.Retrying == nil {
			in.Retrying = []events.RetryingKey{}
		}
		if in.Waiting == nil {
			in.Waiting = []events.WaitingKey{}
		}
		for i := range in.Retrying {
			in.Retrying[i].LastError = redact.Secrets(in.Retrying[i].LastError)
		}
		in.Forged = doc.Forged
		in.Forgeries = append(in.Forgeries, doc.Forgeries...)
		updated := doc.UpdatedAt.UTC()
		in.StatusUpdated, in.Process, in.Stopped = &updated, doc.Process, doc.Stopped
	}
}

// readDLQDepth counts dead letters per instance from one stream info with
// a subject filter (steward.dlq.<worker>.<instance>).
func readDLQDepth(ctx context.Context, js jetstream.JetStream, byName map[string]*Instance) error {
	s, err := streamOrNone(ctx, js, events.StreamDLQ)
	if err != nil || s == nil {
		return err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(events.DLQPrefix+".>"))
	if err != nil {
		return fmt.Errorf("count dead letters in %s: %w", events.StreamDLQ, err)
	}
	for subject, n := range info.State.Subjects {
		rest := strings.TrimPrefix(subject, events.DLQPrefix+".")
		worker, instance, ok := strings.Cut(rest, ".")
		if !ok {
			continue
		}
		name := ConsumerName(worker, instance)
		in, ok := byName[name]
		if !ok {
			// Letters of an instance that has no consumer any more: still
			// the operator's to deal with.
			in = &Instance{Name: name, Worker: worker, Instance: instance,
				Retrying: []events.RetryingKey{}, Waiting: []events.WaitingKey{}}
			byName[name] = in
		}
		in.DeadLetters += n
	}
	return nil
}

// oldestUnsettled is the stored time of the instance's oldest unsettled
// event: the first message on its filters after its ack floor (every
// message at or below the floor is acknowledged, and the first above it is
// not, by the floor's definition). One direct get per filter subject.
func oldestUnsettled(ctx context.Context, s jetstream.Stream, in Instance) (time.Time, bool) {
	var oldest time.Time
	for _, f := range in.filters {
		m, err := s.GetMsg(ctx, in.ackSeq+1, jetstream.WithGetMsgSubject(f))
		if err != nil {
			continue
		}
		if oldest.IsZero() || m.Time.Before(oldest) {
			oldest = m.Time
		}
	}
	return oldest.UTC(), !oldest.IsZero()
}
