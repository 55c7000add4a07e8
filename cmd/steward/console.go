package main

import (
	"context"
	"net/http"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/console"
	"github.com/steward-dev/steward/internal/natsauth"
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
	var docs *events.Store
	var err error
	if g.credsName() != string(natsauth.RolePublisher) {
		docs, err = g.documents(context.Background(), js)
	}
	if err != nil {
		// An identity that may not read the bucket (the ingress is a
		// publisher) still serves the console; its pages then show what
		// they can, and documents unverified.
		g.log.Warn().Err(err).Msg("the console cannot read the checkpoint bucket with these credentials; status documents are not shown verified, and stream readers cannot be paused from it")
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
