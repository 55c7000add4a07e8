// Command watermill is the Watermill path of `steward bench`: Watermill's
// JetStream subscriber (watermill-nats v2, pkg/jetstream) with its
// confirmed ack (AckSync, a DoubleAck per message), reading the bench's
// plain stream on the server at --url, measured as the bench's raw paths
// are. It is a module of its own so that the product does not depend on
// Watermill. `steward bench --watermill internal/bench/watermill` builds
// and runs it once a turn; run by hand, it prints one line of the bench's
// report:
//
//	go run . --url nats://127.0.0.1:4222 --events 20000
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/steward-dev/steward/internal/bench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := bench.ExternalMain(ctx, os.Args[1:], os.Stdout, os.Stderr, "Watermill AckSync, plain stream", consume)
	stop()
	os.Exit(code)
}
