package devstack

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"time"

	"github.com/steward-dev/steward/internal/gateway"
	"github.com/steward-dev/steward/internal/natsauth"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/publisher"
)

// startGateway serves the ingress and the console on the HTTP address:
// the ingress as the publisher, signing with dev's controller key for the
// scoped token; the console as the operator, since it reads what
// operators read.
func (s *Stack) startGateway(ctx context.Context) error {
	s.TokenFile, s.ScopedTokenFile = filepath.Join(s.Dir, TokenFile), filepath.Join(s.Dir, ScopedTokenFile)
	token, err := ingressToken(s.TokenFile)
	if err != nil {
		return err
	}
	s.Token = token
	// dev's controller key signs what its ingress and console publish and
	// what its printed lines publish; its credential and provision
	// workers verify with the public half.
	controllerKey, _, err := signing.DevControllerKey(s.Dir)
	if err != nil {
		return err
	}
	signer, err := signing.LoadEventSigner(controllerKey)
	if err != nil {
		return err
	}
	if s.pubNC, s.pubJS, err = s.connect(ctx, "steward dev ingress", s.PublisherCreds); err != nil {
		return err
	}
	if s.ScopedToken, err = s.scopedToken(); err != nil {
		return err
	}
	audit, verifier, err := s.id.DocumentKeys(s.PublisherCreds, natsauth.Publisher().Name())
	if err != nil {
		return err
	}
	cfg := gateway.Config{Token: token, TokensDir: filepath.Join(s.Dir, TokensDir), Verifier: verifier, Signer: signer,
		NC: s.pubNC, JS: s.pubJS, Audit: audit, ConsoleJS: s.opJS, Registry: s.o.registry, Ready: s.ready, TraceURL: s.o.traceURL, Log: s.o.log}
	if cfg.ConsoleDocs, err = s.operatorDocuments(ctx); err != nil {
		s.o.log.Warn().Err(err).Msg("the console cannot read the checkpoint bucket with these credentials; status documents are not shown verified, and stream readers cannot be paused from it")
	}
	gw, err := gateway.New(cfg)
	if err != nil {
		return err
	}
	return s.serveHTTP(gw)
}

// serveHTTP serves h on the HTTP address until Stop, with the server
// `steward serve` runs (publisher.Server: every phase of a request has a
// deadline, connections are capped). It listens first, so a busy port is
// an error now rather than a log line.
func (s *Stack) serveHTTP(h http.Handler) error {
	srv, err := publisher.NewServer(s.o.httpListen, h, publisher.ServerConfig{})
	if err != nil {
		return fmt.Errorf("--http-listen: %w", err)
	}
	s.HTTP = srv.Addr()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(); err != nil {
			s.o.log.Error().Err(err).Str("addr", s.HTTP).Msg("HTTP server stopped")
		}
	}()
	s.onStop(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	})
	return nil
}
