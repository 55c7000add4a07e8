package natsauth_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/natsauth"
)

// TestBucketNameIsTheRuntimes keeps natsauth's copy of the bucket name
// equal to the runtime's, which it does not import.
func TestBucketNameIsTheRuntimes(t *testing.T) {
	if natsauth.CheckpointBucket != events.CheckpointBucket {
		t.Fatalf("natsauth scopes bucket %s; the runtime uses %s", natsauth.CheckpointBucket, events.CheckpointBucket)
	}
}

// authServer is an embedded JetStream server in JWT mode, configured as
// steward dev configures its own (Authority.Configure).
type authServer struct {
	srv *server.Server
	a   *natsauth.Authority
	dir string
}

func startAuthServer(t *testing.T) *authServer {
	t.Helper()
	dir := t.TempDir()
	a, err := natsauth.LoadOrCreate(filepath.Join(dir, "auth"))
	if err != nil {
		t.Fatal(err)
	}
	o := &server.Options{ServerName: "auth-test", Host: "127.0.0.1", Port: server.RANDOM_PORT,
		JetStream: true, StoreDir: filepath.Join(dir, "js"), NoLog: true, NoSigs: true}
	if err := a.Configure(o); err != nil {
		t.Fatal(err)
	}
	srv, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	return &authServer{srv: srv, a: a, dir: dir}
}

// client is a connection of one identity that records the permission
// violations the server reports to it.
type client struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	denied chan string
}

// connect issues id's credentials into a file and connects with them, as
// `steward --nats-creds` does: the inbox prefix is the one the JWT allows.
func (s *authServer) connect(t *testing.T, id natsauth.Identity) *client {
	t.Helper()
	path := filepath.Join(s.dir, id.Name()+".creds")
	if err := s.a.WriteCreds(path, id); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("creds file %v (%v); want mode 0600", fi, err)
	}
	raw, _ := os.ReadFile(path)
	c := &client{denied: make(chan string, 64)}
	opts := []nats.Option{
		nats.UserCredentials(path),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(err.Error(), "Permissions Violation") {
				c.denied <- err.Error()
			}
		}),
	}
	if p := natsauth.CredsInboxPrefix(raw); p != "" {
		opts = append(opts, nats.CustomInboxPrefix(p))
	}
	nc, err := nats.Connect(s.srv.ClientURL(), opts...)
	if err != nil {
		t.Fatalf("connect as %s: %v", id.Name(), err)
	}
	t.Cleanup(nc.Close)
	if c.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	c.nc = nc
	return c
}

// refused runs do and waits for the server to report a permission
// violation naming subject.
func (c *client) refused(t *testing.T, what, subject string, do func() error) {
	t.Helper()
	_ = do()
	if err := c.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(5 * time.Second)
	for {
		select {
		case msg := <-c.denied:
			if strings.Contains(msg, `"`+subject+`"`) {
				return
			}
		case <-timeout:
			t.Fatalf("%s: the server reported no permission violation for %q", what, subject)
		}
	}
}

// noneRefused fails if the server refused anything the client did.
func (c *client) noneRefused(t *testing.T, who string) {
	t.Helper()
	if err := c.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case msg := <-c.denied:
		t.Fatalf("%s was refused what its role needs: %s", who, msg)
	default:
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// shortCtx bounds a request that is refused: the server drops it, so it
// can only time out.
func shortCtx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Second)
	t.Cleanup(cancel)
	return c
}

// busFixture is what an operator made: the streams, the bucket, a
// checkpoint of instance converge-b, an event.
func busFixture(t *testing.T, op *client) jetstream.KeyValue {
	t.Helper()
	if err := events.EnsureStreams(ctx(t), op.js, events.DefaultStreamConfig()); err != nil {
		t.Fatal(err)
	}
	kv, err := op.js.CreateOrUpdateKeyValue(ctx(t), jetstream.KeyValueConfig{Bucket: natsauth.CheckpointBucket, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx(t), "cp.converge.b.release", []byte(`{"seq":7}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := op.js.Publish(ctx(t), "steward.events.release.published", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	return kv
}

// TestAuthPublisher proves a publisher identity publishes events and does
// nothing else: it cannot write checkpoints, consume any instance's
// subjects or consumer, or call the JetStream API.
func TestAuthPublisher(t *testing.T) {
	s := startAuthServer(t)
	op := s.connect(t, natsauth.Operator())
	kv := busFixture(t, op)
	pub := s.connect(t, natsauth.Publisher())

	// Allowed: a JetStream publish of an event, acknowledged on the
	// publisher's own inbox.
	ack, err := pub.js.Publish(ctx(t), "steward.events.release.published", []byte(`{"version":"1.0.0"}`))
	if err != nil || ack.Stream != events.StreamEvents {
		t.Fatalf("publisher's event: %+v, %v", ack, err)
	}
	pub.noneRefused(t, "the publisher")

	// Allowed: the ingress's one read, the newest event of a key's
	// subject (its signing window's base), and its audit events.
	m, err := pub.nc.Request("$JS.API.DIRECT.GET."+events.StreamEvents+".steward.events.release.published", nil, 5*time.Second)
	if err != nil || m.Header.Get("Status") != "" || m.Header.Get("Nats-Sequence") != "2" {
		t.Fatalf("the publisher's last-by-subject read: %v %v (want sequence 2, the newest release)", m, err)
	}
	if m, err := pub.nc.Request("steward.outcomes.ingress.ci-east", []byte(`{}`), 5*time.Second); err != nil || !strings.Contains(string(m.Data), events.StreamOutcomes) {
		t.Fatalf("the publisher's audit event: %v %v", m, err)
	}
	pub.noneRefused(t, "the publisher")

	key := "$KV." + natsauth.CheckpointBucket + ".cp.converge.b.release"
	pub.refused(t, "write a checkpoint", key, func() error { return pub.nc.Publish(key, []byte(`{"seq":999}`)) })
	if e, err := kv.Get(ctx(t), "cp.converge.b.release"); err != nil || string(e.Value()) != `{"seq":7}` || e.Revision() != 1 {
		t.Fatalf("the checkpoint after the publisher's write: %v %v", e, err)
	}
	pub.refused(t, "subscribe to the events", "steward.events.>", func() error {
		_, err := pub.nc.SubscribeSync("steward.events.>")
		return err
	})
	pub.refused(t, "subscribe to an outcome", "steward.outcomes.converge.b", func() error {
		_, err := pub.nc.SubscribeSync("steward.outcomes.converge.b")
		return err
	})
	pub.refused(t, "subscribe to every inbox", "_INBOX.>", func() error {
		_, err := pub.nc.SubscribeSync("_INBOX.>")
		return err
	})
	for _, subj := range []string{
		"$JS.API.INFO",
		"$JS.API.STREAM.INFO." + events.StreamEvents,
		"$JS.API.STREAM.CREATE.EVIL",
		"$JS.API.STREAM.UPDATE." + events.StreamEvents,
		"$JS.API.STREAM.PURGE." + events.StreamEvents,
		"$JS.API.CONSUMER.CREATE." + events.StreamEvents + ".converge-b",
		"$JS.API.CONSUMER.MSG.NEXT." + events.StreamEvents + ".converge-b",
		"$JS.API.DIRECT.GET.KV_" + natsauth.CheckpointBucket + ".$KV." + natsauth.CheckpointBucket + ".cp.converge.b.release",
		"steward.outcomes.converge.b",
		"steward.dlq.converge.b",
		// The body form of the direct get reads by sequence or any
		// subject, and could not be scoped: not granted.
		"$JS.API.DIRECT.GET." + events.StreamEvents,
		"$JS.API.DIRECT.GET." + events.StreamOutcomes + ".steward.outcomes.converge.b",
		"$JS.API.STREAM.MSG.GET." + events.StreamEvents,
	} {
		pub.refused(t, "publish "+subj, subj, func() error { return pub.nc.Publish(subj, []byte(`{}`)) })
	}
	if _, err := pub.js.Stream(shortCtx(t), events.StreamEvents); err == nil {
		t.Fatal("the publisher read the stream's info")
	}
}

// TestAuthWorker proves a worker instance's identity does all the runtime
// does (its consumer, acks, the order check's reads, its checkpoints,
// stages and status, its outcomes and dead letters) and cannot publish
// events, touch another instance's keys, consumer or outcomes, or manage
// streams.
func TestAuthWorker(t *testing.T) {
	s := startAuthServer(t)
	op := s.connect(t, natsauth.Operator())
	busFixture(t, op)
	id, err := natsauth.Worker("converge", "a")
	if err != nil {
		t.Fatal(err)
	}
	w := s.connect(t, id)

	// What the runtime does, as it does it.
	if _, err := w.js.Stream(ctx(t), events.StreamEvents); err != nil {
		t.Fatalf("stream info: %v", err)
	}
	c, err := w.js.CreateOrUpdateConsumer(ctx(t), events.StreamEvents, jetstream.ConsumerConfig{
		Durable: "converge-a", FilterSubjects: []string{"steward.events.release.published", "steward.events.hostfloor.published"},
		AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1,
	})
	if err != nil {
		t.Fatalf("create its own consumer: %v", err)
	}
	if _, err := w.js.Consumer(ctx(t), events.StreamEvents, "converge-a"); err != nil {
		t.Fatalf("consumer info: %v", err)
	}
	batch, err := c.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got int
	for m := range batch.Messages() {
		got++
		if err := m.InProgress(); err != nil {
			t.Fatal(err)
		}
		if err := m.DoubleAck(ctx(t)); err != nil {
			t.Fatalf("double ack: %v", err)
		}
	}
	if got != 1 || batch.Error() != nil {
		t.Fatalf("fetched %d events (%v); want the one", got, batch.Error())
	}
	st, err := w.js.Stream(ctx(t), events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetMsg(ctx(t), 1, jetstream.WithGetMsgSubject("steward.events.release.published")); err != nil {
		t.Fatalf("the order check's read: %v", err)
	}
	kv, err := w.js.KeyValue(ctx(t), natsauth.CheckpointBucket)
	if err != nil {
		t.Fatalf("bind the bucket: %v", err)
	}
	for _, key := range []string{"cp.converge.a.release", "st.converge.a.release.stage", "rt.converge.a"} {
		if _, err := kv.Get(ctx(t), key); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("read its own %s: %v", key, err)
		}
		rev, err := kv.Create(ctx(t), key, []byte("1"))
		if err != nil {
			t.Fatalf("create %s: %v", key, err)
		}
		if _, err := kv.Update(ctx(t), key, []byte("2"), rev); err != nil {
			t.Fatalf("update %s: %v", key, err)
		}
		if _, err := kv.Put(ctx(t), key, []byte("3")); err != nil {
			t.Fatalf("put %s: %v", key, err)
		}
		if e, err := kv.Get(ctx(t), key); err != nil || string(e.Value()) != "3" {
			t.Fatalf("read back %s: %v %v", key, e, err)
		}
	}
	for _, subj := range []string{events.OutcomeSubject("converge", "a"), events.DLQSubject("converge", "a")} {
		if _, err := w.js.Publish(ctx(t), subj, []byte(`{}`)); err != nil {
			t.Fatalf("publish %s: %v", subj, err)
		}
	}
	w.noneRefused(t, "worker converge-a")

	// What it may not do.
	kvSubj := func(key string) string { return "$KV." + natsauth.CheckpointBucket + "." + key }
	direct := func(key string) string {
		return "$JS.API.DIRECT.GET.KV_" + natsauth.CheckpointBucket + "." + kvSubj(key)
	}
	for _, subj := range []string{
		"steward.events.release.published",
		"steward.events.grant.changed.m1",
		kvSubj("cp.converge.b.release"),
		kvSubj("st.converge.b.x"),
		kvSubj("rt.converge.b"),
		kvSubj("cp.join.a.invitation"),
		kvSubj("rt.converge.a.extra"),
		direct("cp.converge.b.release"),
		direct("rt.join.a"),
		"$JS.API.STREAM.MSG.GET.KV_" + natsauth.CheckpointBucket,
		"$JS.API.STREAM.CREATE." + events.StreamEvents,
		"$JS.API.STREAM.UPDATE." + events.StreamEvents,
		"$JS.API.STREAM.DELETE." + events.StreamEvents,
		"$JS.API.STREAM.PURGE.KV_" + natsauth.CheckpointBucket,
		"$JS.API.CONSUMER.CREATE." + events.StreamEvents + ".converge-b",
		"$JS.API.CONSUMER.DELETE." + events.StreamEvents + ".converge-a",
		"$JS.API.CONSUMER.MSG.NEXT." + events.StreamEvents + ".converge-b",
		"$JS.ACK." + events.StreamEvents + ".converge-b.1.1.1.0.0",
		"steward.outcomes.converge.b",
		"steward.dlq.join.a",
	} {
		w.refused(t, "publish "+subj, subj, func() error { return w.nc.Publish(subj, []byte(`{}`)) })
	}
	if _, err := kv.Get(shortCtx(t), "cp.converge.b.release"); err == nil {
		t.Fatal("converge-a read converge-b's checkpoint")
	}
	for _, subj := range []string{"_INBOX.>", "_INBOX.converge-b.>", "steward.events.>", "$KV." + natsauth.CheckpointBucket + ".>"} {
		w.refused(t, "subscribe "+subj, subj, func() error {
			_, err := w.nc.SubscribeSync(subj)
			return err
		})
	}
	if e, err := op.js.Stream(ctx(t), events.StreamEvents); err != nil || e.CachedInfo().State.Msgs != 1 {
		t.Fatalf("the events stream after the worker's refused writes: %v", err)
	}
}

// TestAuthIssueWithSigningKey proves the fleet path: credentials issued
// from the signing key's seed file alone (as `steward creds issue` does)
// are accepted, carry the instance's name and inbox, and an authority
// reloaded from its folder is the same account.
func TestAuthIssueWithSigningKey(t *testing.T) {
	s := startAuthServer(t)
	auth := filepath.Join(s.dir, "auth")
	seed, err := os.ReadFile(filepath.Join(auth, natsauth.SigningSeedFile))
	if err != nil {
		t.Fatal(err)
	}
	acct, _ := os.ReadFile(filepath.Join(auth, natsauth.AccountPubFile))
	id, _ := natsauth.Worker("join", "box-9")
	creds, err := natsauth.IssueCreds(seed, string(acct), id, testDocKey(t))
	if err != nil {
		t.Fatal(err)
	}
	if p := natsauth.CredsInboxPrefix(creds); p != "_INBOX.join-box-9" {
		t.Fatalf("inbox prefix %q", p)
	}
	if strings.Contains(string(creds), strings.TrimSpace(string(seed))) {
		t.Fatal("the account seed is in the user's credentials")
	}
	path := filepath.Join(t.TempDir(), "join-box-9.creds")
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(s.srv.ClientURL(), nats.UserCredentials(path), nats.CustomInboxPrefix("_INBOX.join-box-9"))
	if err != nil {
		t.Fatalf("connect with issued credentials: %v", err)
	}
	nc.Close()
	// Without the account, the signing key would be taken for the account
	// itself, which the server does not know: refused.
	bad, err := natsauth.IssueCreds(seed, "", id, testDocKey(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect(s.srv.ClientURL(), nats.UserCredentials(path)); err == nil {
		nc.Close()
		t.Fatal("credentials naming no account were accepted")
	}
	// No credentials at all: refused.
	if nc, err := nats.Connect(s.srv.ClientURL()); err == nil {
		nc.Close()
		t.Fatal("a connection without credentials was accepted")
	}
	again, err := natsauth.LoadOrCreate(auth)
	if err != nil || again.AccountPublic != s.a.AccountPublic {
		t.Fatalf("reloaded authority: %v, account %s want %s", err, again.AccountPublic, s.a.AccountPublic)
	}
	if fi, _ := os.Stat(filepath.Join(auth, natsauth.SigningSeedFile)); fi.Mode().Perm() != 0o600 {
		t.Fatalf("signing seed mode %v", fi.Mode().Perm())
	}
	if _, err := natsauth.IssueCreds([]byte("not a seed"), "", id, testDocKey(t)); err == nil || strings.Contains(err.Error(), "not a seed") {
		t.Fatalf("a bad seed: %v (and the error must not quote it)", err)
	}
}

// testDocKey is a fresh document key's public half.
func testDocKey(t *testing.T) ed25519.PublicKey {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return pub
}
