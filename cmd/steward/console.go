package main

import (
	"context"
	"net/http"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/internal/console"
	"github.com/steward-dev/steward/publisher"
)

// mountConsole serves the web console on mux under /, beside the ingress
// (/events), metrics and health: the ingress token is its login. js must
// be the operator's connection (the console reads status, history and
// dead letters, pauses instances and retries letters, through internal/ops
// as `steward status`, `history` and `dlq` do). signer signs grant.changed
// and credential.rotated; nil until `--signing-key` exists, and the
// console then says those types cannot be published from it.
func mountConsole(mux *http.ServeMux, g *globals, js jetstream.JetStream, token string, signer console.Signer) error {
	docs, err := g.documents(context.Background(), js)
	if err != nil {
		return err
	}
	c, err := console.New(console.Config{
		Token:     token,
		JS:        js,
		Docs:      docs,
		Publisher: publisher.New(js, publisher.WithSource(console.Source)),
		Signer:    signer,
		Log:       g.log.With().Str("component", "console").Logger(),
	})
	if err != nil {
		return err
	}
	c.Mount(mux)
	return nil
}
