package main

import (
	"context"
	"net/http"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/internal/console"
	"github.com/steward-dev/steward/publisher"
)

// mountConsole serves the web console on mux under /, beside the ingress
// (/events), metrics and health: the ingress's tokens are its login. js
// must be the operator's connection (the console reads status, history and
// dead letters, pauses instances and retries letters, through internal/ops
// as `steward status`, `history` and `dlq` do). What a login may publish,
// and what is signed for it, is the ingress's own gate's to decide, so the
// console and the ingress never disagree.
func mountConsole(mux *http.ServeMux, g *globals, js jetstream.JetStream, token string, in *ingress) error {
	docs, err := g.documents(context.Background(), js)
	if err != nil {
		return err
	}
	c, err := console.New(console.Config{
		Token:     token,
		Tokens:    in.tokens,
		JS:        js,
		Docs:      docs,
		Publisher: publisher.New(js, publisher.WithSource(console.Source)),
		Signer:    in.gate,
		Log:       g.log.With().Str("component", "console").Logger(),
	})
	if err != nil {
		return err
	}
	c.Mount(mux)
	return nil
}
