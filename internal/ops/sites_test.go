package ops_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/internal/sitetest"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// siteHive is the hive whose instance runs at the site in these tests;
// otherHive's events are another site's.
const (
	siteHive  = "hive-1"
	otherHive = "hive-9"
)

// liveSite is a hub and a site set up as `steward site setup` does, with
// the credential instance of siteHive running at the site on the real
// runtime with its test keys, in the site's domain: it applies every
// rotation but version 2, which it dead-letters, and retries version 1
// once, so it has written a status document.
type liveSite struct {
	pair   *sitetest.Pair
	hub    jetstream.JetStream
	site   jetstream.JetStream
	worker *workertest.Running
}

func startLiveSite(t *testing.T) *liveSite {
	t.Helper()
	pair := sitetest.Start(t, "site-a")
	hubNC, err := nats.Connect(pair.Hub.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hubNC.Close)
	hubJS, err := events.JetStreamIn(hubNC, "")
	if err != nil {
		t.Fatal(err)
	}
	siteNC, err := nats.Connect(pair.Leaf.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(siteNC.Close)
	siteJS, err := events.JetStreamIn(siteNC, pair.Site)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := sitetest.SetupBus(ctx, t, hubJS)
	site := events.Site{Name: pair.Site, HubDomain: sitetest.HubDomain, Hives: []string{siteHive}}
	if err := events.SetupSite(ctx, siteJS, hubJS, cfg, site); err != nil {
		t.Fatal(err)
	}
	var failedOnce atomic.Bool
	w := workertest.Start(t, siteJS, credSpec(siteHive), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		var r events.CredentialRotated
		if err := d.DataAs(&r); err != nil {
			return err
		}
		if r.Version == 1 && failedOnce.CompareAndSwap(false, true) {
			// Once retrying, the instance writes its status document.
			return errors.New("the hive is busy")
		}
		if r.Version == 2 {
			return workers.Permanent(errors.New("the hive's folder is gone"))
		}
		return d.Emit(ctx, "applied", map[string]any{"version": r.Version})
	}), workers.WithDomain(pair.Site), workertest.StatusEvery(50*time.Millisecond))
	return &liveSite{pair: pair, hub: hubJS, site: siteJS, worker: w}
}

// siteIn is the site's entry in st.
func siteIn(t *testing.T, st *ops.Status, name string) ops.SiteStatus {
	t.Helper()
	for _, s := range st.Sites {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("the hub's status shows no site %s: %+v", name, st.Sites)
	return ops.SiteStatus{}
}

// storedAt is when the hub stored the event at seq of STEWARD_EVENTS.
func storedAt(t *testing.T, js jetstream.JetStream, seq uint64) time.Time {
	t.Helper()
	s, err := js.Stream(context.Background(), events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(context.Background(), seq)
	if err != nil {
		t.Fatal(err)
	}
	return m.Time.UTC()
}

// The hub's status shows its site: linked and caught up, with its
// instances as they report themselves at the site, verified in the site's
// domain. Through a cut the link shows down, the lag counts exactly the
// site's events published since, with the age of the oldest, and growing;
// the instances show as unreachable with why, never as none. When the
// link is back the site catches up and its instances show again.
func TestHubStatusShowsEachSiteThroughACut(t *testing.T) {
	ls := startLiveSite(t)
	docs := workertest.OperatorDocs(t, ls.hub)
	o := ops.StatusOptions{Docs: docs, Limit: -1}

	// A status document for another instance, signed by it but for the
	// hub's domain and put in the site's bucket: copied across domains, it
	// must show as forged, never as what that instance says.
	siteKV, err := ls.site.KeyValue(context.Background(), events.CheckpointBucket)
	if err != nil {
		t.Fatal(err)
	}
	copied := events.NewStore(siteKV, events.StoreOptions{Signer: workertest.Signer("credential-hive-2"), Verifier: workertest.Verifier(), Domain: ""})
	if _, err := copied.Set(context.Background(), events.StatusKey("credential", "hive-2"),
		events.Status{Worker: "credential", Instance: "hive-2", UpdatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}

	publishTraced(t, ls.hub, siteHive, 1, "")
	publishTraced(t, ls.hub, otherHive, 1, "")
	workertest.WaitIdle(t, ls.site, ls.worker.ConsumerName())
	var site ops.SiteStatus
	workertest.WaitUntil(t, "the site shows linked, caught up, with its instance's status", func() bool {
		site = siteIn(t, statusOf(t, ls.hub, o), "site-a")
		in := instanceIn(site.InstanceSummary, "credential-hive-1")
		return site.Linked && site.Pending == 0 && site.Unreachable == "" && site.Total == 2 &&
			in.StatusUpdated != nil && in.State == ops.StateOK
	})
	if site.OldestPending != nil {
		t.Errorf("a caught-up site shows an oldest pending event stored at %v", site.OldestPending)
	}
	in := instanceIn(site.InstanceSummary, "credential-hive-1")
	if !in.HasConsumer || in.State != ops.StateOK || in.StatusForged != "" || in.StatusUnverified {
		t.Errorf("the site's instance: consumer %v, state %s, forged %q, unverified %v: want its own consumer and signed status, ok",
			in.HasConsumer, in.State, in.StatusForged, in.StatusUnverified)
	}
	if f := instanceIn(site.InstanceSummary, "credential-hive-2"); f.StatusForged == "" {
		t.Error("a status document signed for the hub's domain is believed at the site")
	}
	if len(statusOf(t, ls.hub, ops.StatusOptions{Docs: docs, Worker: "converge"}).Sites[0].Instances) != 0 {
		t.Error("--worker converge still lists the site's credential instances")
	}

	// The cut.
	ls.pair.Cut()
	publishTraced(t, ls.hub, siteHive, 3, "")
	firstSeq := lastSeq(t, ls.hub)
	publishTraced(t, ls.hub, otherHive, 2, "")
	publishTraced(t, ls.hub, siteHive, 4, "")
	workertest.WaitUntil(t, "the hub sees the site's source unbound", func() bool {
		return !siteIn(t, statusOf(t, ls.hub, o), "site-a").Linked
	})
	cut := siteIn(t, statusOf(t, ls.hub, o), "site-a")
	if cut.Pending != 2 {
		t.Errorf("cut: %d pending, want the 2 events of the site's hive published since (not the other site's)", cut.Pending)
	}
	if want := storedAt(t, ls.hub, firstSeq); cut.OldestPending == nil || !cut.OldestPending.Equal(want) {
		t.Errorf("cut: oldest pending stored at %v, want %v: the first event published for the site since the cut", cut.OldestPending, want)
	}
	if cut.Unreachable == "" || cut.Total != 0 || len(cut.Instances) != 0 {
		t.Errorf("cut: unreachable %q with %d instances: want the site shown unreachable, with why, and no instances claimed", cut.Unreachable, cut.Total)
	}
	publishTraced(t, ls.hub, siteHive, 5, "")
	later := siteIn(t, statusOf(t, ls.hub, o), "site-a")
	if later.Pending != 3 || later.OldestPending == nil || !later.OldestPending.Equal(*cut.OldestPending) || later.OldestPendingSeconds <= cut.OldestPendingSeconds {
		t.Errorf("the cut goes on: %d pending, oldest %v aged %.3fs (was %.3fs): want 3, the same oldest event, older",
			later.Pending, later.OldestPending, later.OldestPendingSeconds, cut.OldestPendingSeconds)
	}
	sites, err := ops.Sites(context.Background(), ls.hub)
	if err != nil {
		t.Fatal(err)
	}
	if len(sites) != 1 || sites[0].OldestPending == nil || !sites[0].OldestPending.Equal(*cut.OldestPending) {
		t.Errorf("steward site status: %+v, want site-a with the age of the same oldest event", sites)
	}

	// The heal.
	ls.pair.Restart()
	workertest.WaitUntil(t, "the site catches up and shows its instances again", func() bool {
		s := siteIn(t, statusOf(t, ls.hub, o), "site-a")
		return s.Linked && s.Pending == 0 && s.OldestPending == nil && s.Unreachable == "" &&
			instanceIn(s.InstanceSummary, "credential-hive-1").HasConsumer
	})
	workertest.WaitUntil(t, "the site's instance applies what was published during the cut", func() bool {
		n := len(workertest.Outcomes(t, ls.site, "credential", siteHive))
		return n == 4
	})
}

func instanceIn(sum ops.InstanceSummary, name string) ops.Instance {
	for _, in := range sum.Instances {
		if in.Name == name {
			return in
		}
	}
	return ops.Instance{}
}

// lastSeq is STEWARD_EVENTS' last sequence.
func lastSeq(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	s, err := js.Stream(context.Background(), events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().State.LastSeq
}

// hubCopyOf waits until the hub's stream holds what its source brought
// from the site on subject, and returns it as stored.
func hubCopyOf(t *testing.T, hub jetstream.JetStream, stream, subject string) *jetstream.RawStreamMsg {
	t.Helper()
	var m *jetstream.RawStreamMsg
	workertest.WaitUntil(t, "the hub's "+stream+" holds the site's "+subject, func() bool {
		s, err := hub.Stream(context.Background(), stream)
		if err != nil {
			return false
		}
		m, err = s.GetLastMsgForSubject(context.Background(), subject)
		return err == nil
	})
	return m
}

// Outcomes and dead letters written at a site are signed for the site's
// domain; sourced to the hub, every hub-side reader (history, dead
// letters, a message's page, status) verifies them in the domain of the
// source they came through, and believes them. What merely looks sourced
// gains nothing: a genuine site outcome published again at the hub, with
// or without the header naming the site's source, or with the headers of
// a reflected answer, or naming a domain the hub does not source, is
// forged.
func TestSourcedOutcomesAndLettersVerifyAtTheHub(t *testing.T) {
	ls := startLiveSite(t)
	ctx := context.Background()
	proofs := ops.Proofs{Verifier: workertest.Verifier()}
	publishTraced(t, ls.hub, siteHive, 1, "")
	publishTraced(t, ls.hub, siteHive, 2, "")
	subject := events.OutcomeSubject("credential", siteHive)
	outcome := hubCopyOf(t, ls.hub, events.StreamOutcomes, subject)
	letter := hubCopyOf(t, ls.hub, events.StreamDLQ, events.DLQSubject("credential", siteHive))

	// The function every reader's check goes through, on the header the
	// hub's server wrote: it names the site's source, by nats-server's
	// hash of its API prefix.
	outStream, err := ls.hub.Stream(ctx, events.StreamOutcomes)
	if err != nil {
		t.Fatal(err)
	}
	sources := events.SourceDomainsOf(outStream.CachedInfo().Config)
	if got := sources.ProofDomain("", subject, outcome.Header); got != "site-a" {
		t.Fatalf("a sourced outcome (%s: %q) is verified in domain %q, want site-a's", events.StreamSourceHeader,
			outcome.Header.Get(events.StreamSourceHeader), got)
	}
	lookalikes := map[string]nats.Header{
		"the headers of a reflected answer": withHeaders(outcome.Header, "Nats-Stream", events.StreamOutcomes, "Nats-Sequence", "1"),
		"two source headers":                withHeaders(outcome.Header, events.StreamSourceHeader, outcome.Header.Get(events.StreamSourceHeader)),
		"another subject's source header":   withHeaders(nil, events.StreamSourceHeader, replaceField(outcome.Header.Get(events.StreamSourceHeader), 4, events.OutcomeSubject("credential", "hive-2"))),
	}
	for name, h := range lookalikes {
		if got := sources.ProofDomain("", subject, h); got != "" {
			t.Errorf("%s: verified in domain %q, want the hub's own", name, got)
		}
	}
	if got := (events.SourceDomains{}).ProofDomain("", subject, outcome.Header); got != "" {
		t.Errorf("a stream that sources no site verifies a message naming site-a's source in %q, want its own domain", got)
	}

	// Every reader at the hub believes the site's own.
	h, err := ops.GetHistory(ctx, ls.hub, ops.HistoryOptions{Worker: "credential", Key: siteHive, Proofs: proofs})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, en := range h.Entries {
		if en.Kind == ops.EntryEvent {
			continue
		}
		kinds[en.Kind]++
		if en.Forged != "" || en.Unverified {
			t.Errorf("history: the site's %s %d is forged %q, unverified %v: want it verified in site-a's domain", en.Kind, en.Sequence, en.Forged, en.Unverified)
		}
	}
	if kinds[ops.EntryOutcome] != 1 || kinds[ops.EntryDeadLetter] != 1 {
		t.Errorf("history holds %v, want the site's one outcome and one dead letter", kinds)
	}
	letters, err := ops.ListLetters(ctx, ls.hub, ops.LetterFilter{}, proofs)
	if err != nil {
		t.Fatal(err)
	}
	if len(letters.Letters) != 1 || letters.Letters[0].Forged != "" || letters.Letters[0].Unverified {
		t.Errorf("steward dlq ls at the hub: %+v, want the site's letter, verified", letters.Letters)
	}
	if l, err := ops.GetLetter(ctx, ls.hub, letter.Sequence, proofs); err != nil || l.Forged != "" {
		t.Errorf("steward dlq show at the hub: forged %q, %v", l.Forged, err)
	}
	if m, err := ops.GetMessage(ctx, ls.hub, events.StreamOutcomes, outcome.Sequence, proofs, ops.EnvelopeKeys{}); err != nil || m.Forged != "" || m.Unverified {
		t.Errorf("the console's message page at the hub: %+v, %v: want the site's outcome verified", m, err)
	}
	st := statusOf(t, ls.hub, ops.StatusOptions{Docs: workertest.OperatorDocs(t, ls.hub), Limit: -1})
	if in := instanceOf(t, st, "credential-hive-1"); in.LastDeadLetter == nil || in.LastDeadLetter.Forged != "" {
		t.Errorf("the hub's status: last dead letter of the site's instance %+v, want it verified", in.LastDeadLetter)
	}

	// The attacks: the site's genuine outcome stored again at the hub on
	// the instance's subject, with the header naming the site's source
	// (nats-server refuses a published message that carries it; if one
	// ever landed it must not be believed) and without it (it lands, and
	// its proof binds site-a, not the hub).
	replay := nats.NewMsg(subject)
	replay.Header, replay.Data = withHeaders(outcome.Header), outcome.Data
	replay.Header.Del(nats.MsgIdHdr)
	if ack, err := ls.hub.PublishMsg(ctx, replay); err == nil {
		t.Logf("the hub stored a published message carrying %s, at %d", events.StreamSourceHeader, ack.Sequence)
	} else {
		t.Logf("the hub refused a published message carrying %s: %v", events.StreamSourceHeader, err)
	}
	bare := nats.NewMsg(subject)
	bare.Header, bare.Data = withHeaders(outcome.Header), outcome.Data
	bare.Header.Del(events.StreamSourceHeader)
	// Under its own id the copy would be dropped as a duplicate.
	bare.Header.Del(nats.MsgIdHdr)
	if _, err := ls.hub.PublishMsg(ctx, bare); err != nil {
		t.Fatal(err)
	}
	h, err = ops.GetHistory(ctx, ls.hub, ops.HistoryOptions{Worker: "credential", Key: siteHive, Proofs: proofs})
	if err != nil {
		t.Fatal(err)
	}
	believed, forged := 0, 0
	for _, en := range h.Entries {
		switch {
		case en.Kind != ops.EntryOutcome:
		case en.Forged == "":
			believed++
		default:
			forged++
		}
	}
	if believed != 1 || forged < 1 {
		t.Errorf("after the replays at the hub: %d outcomes believed, %d forged; want only the sourced one believed, the replays forged", believed, forged)
	}
}

// withHeaders is a copy of h with each name given the value after it added.
func withHeaders(h nats.Header, kv ...string) nats.Header {
	out := nats.Header{}
	for k, vs := range h {
		out[k] = append([]string(nil), vs...)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out.Add(kv[i], kv[i+1])
	}
	return out
}

// replaceField is s, its space-separated field i replaced by v.
func replaceField(s string, i int, v string) string {
	fields := strings.Split(s, " ")
	if i < len(fields) {
		fields[i] = v
	}
	return strings.Join(fields, " ")
}

// TestResumeFromTheHubSaysASiteReaderIsNotWoken pauses a stream-reading
// instance at a site and resumes it from the hub, across the leaf link: the
// pause is lifted, and the operator is told the wake-up stays at the hub
// (the link carries none of Steward's subjects). Resumed at the site's
// leaf node, the reader is woken and handles the event published while it
// was paused.
func TestResumeFromTheHubSaysASiteReaderIsNotWoken(t *testing.T) {
	const hive = "hive-r"
	pair := sitetest.Start(t, "site-a")
	hubNC, hubJS := sitetest.Connect(t, pair.Hub, "")
	_, siteJS := sitetest.Connect(t, pair.Leaf, pair.Site)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := sitetest.SetupBus(ctx, t, hubJS)
	if err := events.SetupSite(ctx, siteJS, hubJS, cfg, events.Site{Name: pair.Site, HubDomain: sitetest.HubDomain, Hives: []string{hive}}); err != nil {
		t.Fatal(err)
	}
	handled := make(chan uint64, 4)
	workertest.Start(t, siteJS, credSpec(hive), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		var r events.CredentialRotated
		if err := d.DataAs(&r); err != nil {
			return err
		}
		handled <- r.Version
		return nil
	}), workers.WithDomain(pair.Site), workers.WithReadMode(workers.ReadStream))
	siteKV, err := siteJS.KeyValue(ctx, events.CheckpointBucket)
	if err != nil {
		t.Fatal(err)
	}
	workertest.WaitUntil(t, "the reader's cursor is written at the site", func() bool {
		_, err := siteKV.Get(ctx, events.CursorKey("credential", hive))
		return err == nil
	})
	siteDocs := events.NewStore(siteKV, events.StoreOptions{Signer: workertest.Signer(events.OperatorWriter), Verifier: workertest.Verifier(), Domain: pair.Site})
	if _, err := ops.Pause(ctx, siteJS, siteDocs, "credential", hive, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	publishTraced(t, hubJS, hive, 1, "")
	workertest.WaitUntil(t, "the event reaches the site", func() bool {
		info, err := siteJS.Stream(ctx, events.StreamEvents)
		return err == nil && info.CachedInfo().State.Msgs == 1
	})

	acrossJS, err := events.JetStreamIn(hubNC, pair.Site)
	if err != nil {
		t.Fatal(err)
	}
	p, err := ops.Resume(ctx, acrossJS, nil, "credential", hive)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(p.Note, "does not cross the leaf link") || !strings.Contains(p.Note, "--js-domain site-a") {
		t.Fatalf("resumed from the hub with the note %q; want the operator told the reader is not woken, and how to wake it", p.Note)
	}
	if _, err := siteKV.Get(ctx, events.PauseKey("credential", hive)); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("after the resume from the hub the site's pause is %v, want deleted", err)
	}
	p, err = ops.Resume(ctx, siteJS, nil, "credential", hive)
	if err != nil || p.Note != "" {
		t.Fatalf("resumed at the site: note %q, err %v; want no note", p.Note, err)
	}
	select {
	case v := <-handled:
		if v != 1 {
			t.Fatalf("handled version %d, want 1", v)
		}
	case <-ctx.Done():
		t.Fatal("resumed at the site's leaf node, the reader was not woken")
	}
}

// A paged listing that hands a consumer back twice (a page starting one
// too early, after a consumer was deleted between pages) lists it once:
// a site, an instance or a consumer is never shown twice.
func TestAListingThatRepeatsAConsumerListsItOnce(t *testing.T) {
	infos := make(chan *jetstream.ConsumerInfo, 3)
	for _, name := range []string{"ordered-x", "site-a", "site-a"} {
		infos <- &jetstream.ConsumerInfo{Name: name}
	}
	close(infos)
	var got []string
	for _, info := range ops.OnceEach(infos) {
		got = append(got, info.Name)
	}
	if strings.Join(got, " ") != "ordered-x site-a" {
		t.Fatalf("listed %v, want ordered-x and site-a once each", got)
	}
}
