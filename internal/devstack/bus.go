package devstack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/natsauth"
)

// Where the stack keeps its NATS authority (seeds and JWTs) and the
// credentials it issues from it, under Dir.
const (
	AuthDir  = "nats-auth"
	CredsDir = "creds"
)

// startBus starts the embedded server behind the stack's own authority,
// with the operator's and the publishers' credentials issued, and starts
// PostgreSQL beside it.
func (s *Stack) startBus(ctx context.Context) error {
	if err := os.MkdirAll(s.StoreDir(), 0o700); err != nil {
		return fmt.Errorf("--dir: %w", err)
	}
	// The bus is closed in dev too: the embedded server trusts dev's own
	// operator and account (kept under Dir, so the store's account stays
	// the same across runs), and every part connects with credentials
	// scoped to its role.
	auth, err := natsauth.LoadOrCreate(filepath.Join(s.Dir, AuthDir))
	if err != nil {
		return err
	}
	s.auth, s.CredsDir = auth, filepath.Join(s.Dir, CredsDir)
	if err := os.MkdirAll(s.CredsDir, 0o700); err != nil {
		return fmt.Errorf("--dir: %w", err)
	}
	if s.OperatorCreds, err = s.writeCreds(natsauth.Operator()); err != nil {
		return err
	}
	if s.PublisherCreds, err = s.writeCreds(natsauth.Publisher()); err != nil {
		return err
	}
	srv, err := startNATS(s.StoreDir(), s.o.natsListen, auth)
	if err != nil {
		return err
	}
	// PostgreSQL comes up (initdb takes a second the first time) while
	// the streams and the gateway do; it stops last, after the workers
	// using it and NATS.
	s.pg = make(chan *Postgres, 1)
	go func() { s.pg <- startPostgres(ctx, s.Dir, s.o.databaseURL, s.o.pgBin) }()
	s.onStop(func() {
		if s.Postgres == nil {
			s.Postgres = <-s.pg
		}
		s.stopErr = s.Postgres.stop()
	})
	s.NATS = srv
	s.onStop(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return nil
}

// writeCreds issues id's credentials into <CredsDir>/<name>.creds (0600,
// atomically) and returns the path. They are issued anew each run: a user
// key costs nothing, and old files never outlive a Dir.
func (s *Stack) writeCreds(id natsauth.Identity) (string, error) {
	path := filepath.Join(s.CredsDir, id.Name()+".creds")
	if err := s.auth.WriteCreds(path, id); err != nil {
		return "", err
	}
	return path, nil
}

// setup creates the streams and the bucket, and the bucket's upgrade
// record, as the operator, as compose's setup service does: workers may
// not.
func (s *Stack) setup(ctx context.Context) error {
	nc, js, err := s.connect(ctx, "steward dev setup", s.OperatorCreds)
	if err != nil {
		return err
	}
	s.opNC, s.opJS = nc, js
	if err := events.SetupBus(ctx, js, events.DefaultBusConfig(s.o.replicas)); err != nil {
		return err
	}
	docs, err := s.operatorDocuments(ctx)
	if err != nil {
		return err
	}
	if docs == nil {
		return fmt.Errorf("the bucket %s was not found after setting it up", events.CheckpointBucket)
	}
	s.opDocs = docs
	_, err = docs.RecordUpgrade(ctx)
	return err
}

// operatorDocuments opens the checkpoint bucket as the operator: nil (and
// no error) when it does not exist.
func (s *Stack) operatorDocuments(ctx context.Context) (*events.Store, error) {
	signer, verifier, err := s.id.DocumentKeys(s.OperatorCreds, natsauth.Operator().Name())
	if err != nil {
		return nil, err
	}
	docs, err := events.OpenStore(ctx, s.opJS, events.StoreOptions{Signer: signer, Verifier: verifier})
	if err != nil {
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil, nil
		}
		return nil, err
	}
	return docs, nil
}

// startNATS starts the embedded server. It refuses 4222, the port of a
// NATS an operator may already run, whose streams dev must not touch.
func startNATS(store, listen string, auth *natsauth.Authority) (*server.Server, error) {
	host, portText, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("--nats-listen %q is not host:port: %w", listen, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("--nats-listen %q: the port is not a number from 0 to 65535", listen)
	}
	if port == 4222 {
		return nil, errors.New("--nats-listen: dev does not take 4222, the port of a real NATS server; use another (default 4223)")
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	// Checked first: the server reports a busy port only in its log.
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("--nats-listen %s: %w (is another steward dev running? give another --nats-listen)", listen, err)
	}
	ln.Close()
	opts := &server.Options{ServerName: "steward-dev", Host: host, Port: port, JetStream: true, StoreDir: store, NoLog: true, NoSigs: true}
	if err := auth.Configure(opts); err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(15 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("embedded NATS on %s did not become ready in 15s (store %s)", listen, store)
	}
	return srv, nil
}
