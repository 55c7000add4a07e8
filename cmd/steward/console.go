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
// dead letters, pauses instances and retries letters). signer signs
// grant.changed and credential.rotated; nil until `--signing-key` exists,
// and the console then says those types cannot be published from it.
func mountConsole(mux *http.ServeMux, g *globals, js jetstream.JetStream, token string, signer console.Signer) error {
	c, err := console.New(console.Config{
		Token:       token,
		JS:          js,
		Publisher:   publisher.New(js, publisher.WithSource(console.Source)),
		DeadLetters: dlqCode{js: js},
		Signer:      signer,
		Log:         g.log.With().Str("component", "console").Logger(),
	})
	if err != nil {
		return err
	}
	c.Mount(mux)
	return nil
}

// dlqCode is `steward dlq`'s code (dlq.go) as the console's DeadLetters, so
// the console lists, shows and retries letters exactly as the command does.
type dlqCode struct{ js jetstream.JetStream }

func (d dlqCode) List(ctx context.Context, f console.Filter) ([]console.Letter, error) {
	// The worker selection is dlq.go's own; the console's further
	// selections (type, reason, time) are applied to what it read.
	list, err := readDLQ(ctx, d.js, dlqFilter{worker: f.Worker})
	if err != nil {
		return nil, err
	}
	out := make([]console.Letter, 0, len(list))
	for _, l := range list {
		if f.Match(l) {
			out = append(out, console.Letter{DeadLetter: l})
		}
	}
	return out, nil
}

func (d dlqCode) Get(ctx context.Context, seq uint64) (console.Letter, error) {
	l, err := getDeadLetter(ctx, d.js, seq)
	return console.Letter{DeadLetter: l}, err
}

func (d dlqCode) Retry(ctx context.Context, l console.Letter) (console.Retried, error) {
	r, err := retryDeadLetter(ctx, d.js, l.DeadLetter)
	if err != nil {
		return console.Retried{}, err
	}
	return console.Retried{EventID: r.event.ID(), Subject: r.subject, Sequence: r.seq, Already: r.already}, nil
}

func (d dlqCode) Remove(ctx context.Context, seq uint64) error {
	return console.RemoveLetter(ctx, d.js, seq)
}
