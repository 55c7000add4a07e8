// Package devstack assembles `steward dev`: an embedded NATS server with
// JetStream behind JWT authentication (its operator, account and every
// identity's credentials kept under one folder), the streams and the
// bucket made as the operator, the ingress and the console (the gateway)
// as the publisher, a private PostgreSQL for the provision worker, and one
// development instance of every worker, each connected as itself. The
// command parses flags and prints; everything it starts is here.
package devstack

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/natsauth"
	"github.com/steward-dev/steward/internal/proof"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/converge"
)

// Identity is how a part of the stack connects to the embedded server with
// the credentials the stack issued it, and the document keys it signs and
// believes with: the command's own way, so its flags (inbox prefix, pinned
// keys) hold for dev's parts as for every other process.
type Identity interface {
	// Connect opens a connection named name to url as creds.
	Connect(ctx context.Context, name, url, creds string) (*nats.Conn, jetstream.JetStream, error)
	// DocumentKeys are the signer and verifier of the identity named by
	// whose credentials are creds.
	DocumentKeys(creds, by string) (*proof.Signer, *proof.Verifier, error)
}

// Service is what a worker package's *Worker is: a handler with its Spec,
// closed when the stack stops.
type Service interface {
	workers.Handler
	Spec() workers.Spec
	Close() error
}

// Worker is one worker the stack runs a development instance of.
type Worker struct {
	Name string
	// Dev builds the instance, its keys and fixtures under dir, with the
	// lines telling a newcomer how to feed it. The provision worker's is
	// replaced by one against the stack's PostgreSQL, and converge's by
	// one built from its installed version as the bucket holds it.
	Dev func(ctx context.Context, dir string) (Service, []string, error)
}

// Stack is a running development stack. Its fields are set by Start, for
// the command to print.
type Stack struct {
	// Dir holds everything the stack makes, reused by the next run.
	Dir string
	// NATS is the embedded server; OperatorCreds and PublisherCreds the
	// credentials files of the operator and of publishers, under CredsDir.
	NATS                          *server.Server
	CredsDir                      string
	OperatorCreds, PublisherCreds string
	// HTTP is the gateway's address (host:port).
	HTTP string
	// Token is the unscoped ingress token, kept in TokenFile; ScopedToken
	// the secret of the scoped token "dev" (empty when the operator's
	// credentials have no document key), kept in ScopedTokenFile.
	Token, TokenFile             string
	ScopedToken, ScopedTokenFile string
	// Postgres is the provision worker's server.
	Postgres *Postgres
	// Workers are the workers, in the order given, running or not.
	Workers []WorkerState
	// Converge is converge's development install as the bucket held it
	// at start: its lines converge to the first two of Converge.Next, and
	// the command prints its ways to publish with the next three.
	Converge converge.DevState

	id   Identity
	o    options
	auth *natsauth.Authority
	opNC *nats.Conn
	opJS jetstream.JetStream
	// opDocs is the bucket as the operator reads it.
	opDocs *events.Store
	pubNC  *nats.Conn
	pubJS  jetstream.JetStream
	pg     chan *Postgres
	// stops undo what Start did, last first.
	stops     []func()
	conns     []*nats.Conn
	runCancel context.CancelFunc
	wg        sync.WaitGroup
	mu        sync.Mutex
	running   []*workers.Runtime
	stopOnce  sync.Once
	stopErr   error
}

// New returns the stack that keeps its state under dir and connects its
// parts through id.
func New(dir string, id Identity, opts ...Option) *Stack {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	return &Stack{Dir: dir, id: id, o: o}
}

// URL is the embedded server's client URL.
func (s *Stack) URL() string { return s.NATS.ClientURL() }

// StoreDir is where the embedded server keeps JetStream's store.
func (s *Stack) StoreDir() string { return filepath.Join(s.Dir, "nats") }

// Start brings the stack up: NATS, the streams and the bucket, the
// gateway, PostgreSQL and the workers. On an error what was started is
// still stopped by Stop.
func (s *Stack) Start(ctx context.Context) error {
	if err := s.startBus(ctx); err != nil {
		return err
	}
	if err := s.setup(ctx); err != nil {
		return err
	}
	if err := s.startGateway(ctx); err != nil {
		return err
	}
	s.Postgres = <-s.pg
	s.startWorkers(ctx)
	return nil
}

// Stop stops the workers (they finish what they hold), then the gateway,
// NATS and PostgreSQL, and returns why PostgreSQL did not stop, if it did
// not. It may be called more than once.
func (s *Stack) Stop() error {
	s.stopOnce.Do(func() {
		if s.runCancel != nil {
			s.runCancel()
		}
		s.wg.Wait()
		for _, c := range s.conns {
			// Naks sent at shutdown reach the server before the
			// connection closes, so what was handed back is redelivered.
			if err := c.FlushTimeout(5 * time.Second); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
				s.o.log.Warn().Err(err).Msg("NATS flush at shutdown")
			}
		}
		for i := len(s.stops) - 1; i >= 0; i-- {
			s.stops[i]()
		}
	})
	return s.stopErr
}

// onStop registers what Stop undoes (last registered, first undone).
func (s *Stack) onStop(f func()) { s.stops = append(s.stops, f) }

// connect connects as creds and closes the connection at Stop.
func (s *Stack) connect(ctx context.Context, name, creds string) (*nats.Conn, jetstream.JetStream, error) {
	nc, js, err := s.id.Connect(ctx, name, s.URL(), creds)
	if err != nil {
		return nil, nil, err
	}
	s.conns = append(s.conns, nc)
	s.onStop(nc.Close)
	return nc, js, nil
}

// ready is /readyz: the ingress's connection is up and every running
// worker is ready.
func (s *Stack) ready() error {
	if !s.pubNC.IsConnected() {
		return fmt.Errorf("NATS is %s", s.pubNC.Status())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.running {
		if err := w.Ready(); err != nil {
			return err
		}
	}
	return nil
}
