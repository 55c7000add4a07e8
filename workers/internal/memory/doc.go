// Package memory holds in memory what the runtime's engine otherwise asks
// of JetStream: the checkpoint bucket (KV), the streams it publishes to and
// reads back (Streams) and the messages it settles (Msg). workertest runs
// the real engine over these, so a handler tested without a server goes
// through the same executor, settler and keyed queue as in production; each
// part keeps the server's rules that the engine relies on (revisions and
// compare-and-swap, deduplication by Nats-Msg-Id, what settling a message
// means) and nothing more.
package memory
