/*
Package workers is the runtime every Steward worker shares. A worker is a
Handler that makes the world match one event, and a Spec that says what it
consumes; the runtime does the rest: it consumes, orders, retries,
supersedes, checkpoints, dead-letters and reports.

Every event is desired state for one key, and the runtime converges like a
Kubernetes controller: the newest desired state of every key is applied,
whatever failed or restarted in between, and nobody has to redrive it.

# What a handler's result means

  - nil: the event is applied. The key's checkpoint moves to it, then the
    ack is confirmed (DoubleAck). Events of one key handled one after the
    other share one checkpoint write, before any of their acks, and the
    confirmation of the last ack confirms the run's.
  - Refused(err): a policy refusal (a downgrade, a bad signature, a stale
    version). The handler has emitted its refused outcome; the event is
    settled like an applied one, counted as refused, never dead-lettered.
  - Permanent(err): the event cannot be processed at all. It goes to the
    dead-letter stream with err as the reason, on the first delivery.
  - any other error: retried, in this process and without a redelivery,
    with capped exponential backoff and jitter (from half a second up to
    DefaultMaxBackoff; WithMaxBackoff changes it) for as long as it fails, until it applies or a
    newer verified event of its key supersedes it. The message stays held
    and heartbeated meanwhile, so no delivery count runs out.
  - a panic: caught and retried like an error, at most WithMaxPanics times,
    then dead-lettered with the panic as the reason.

An event that fails validation (an unknown type, missing attributes, data
its JSON Schema refuses, a subject that does not name its key) never
reaches the handler: it is dead-lettered in its turn, on its first
delivery, and moves no checkpoint.

# Order and latest wins

Events of one key run one at a time in stream order; keys run in parallel
up to WithConcurrency. Under a latest-wins Spec (Spec.Rank set), an event
not yet applied is superseded by a newer one of its key queued behind it:
"newer" is the worker's own order (a generation, a version, a signed time)
read from an event that passed the worker's verification, so an event that
fails verification supersedes nothing. A superseded event is settled with a
superseded outcome (events.OutcomeSuperseded), never applied after the newer one.

# Progress, state and replays

A KV checkpoint per key holds the last settled stream sequence and the
stage a handler saved (Delivery.SaveStage), so a redelivery resumes
(Delivery.LoadStage) and a late, older event is skipped. A handler's own
durable documents (the installed version, the newest host floor) live in
its State, written with compare-and-swap. An event delivered more than
WithMaxDeliver times without ever settling (a crash loop) is
dead-lettered. SIGTERM stops pulling, lets handlers finish within the
shutdown grace and naks the rest for immediate redelivery. Package replay
runs stored events through the handler again, outside the consumer.

The keys being retried and the keys waiting behind an earlier event are
published in a status document (events.StatusKey) and as metrics; error text is
never a metric label.

# Writing a worker

A worker package (converge, join, credential and provision are the four
Steward ships) has a Config with AddFlags, a New that checks it and returns
the worker (the Handler with its Spec, and Close), and a Dev that prepares
a development instance; one line of cmd/steward/kinds.go registers it, which
gives it `steward worker`, `steward replay` and a place in `steward dev`
(the command's plugin contract, cmd/steward/plugin.go).

A handler only ever sees its Delivery: the event, its key, its attempt, and
through it the means to emit outcomes, save a stage and read and write
state. In production those are JetStream and the checkpoint bucket; in
tests, package workertest runs one event, or a recorded stream that
`steward export` wrote, through a handler with no server, on this
package's own engine over a bucket and streams kept in memory, and returns
what it did (outcomes, dead letters, stages, state). Example_customWorker is the tutorial: it writes a
fifth worker, tests it with workertest and registers it.

Outcomes are CloudEvents of type dev.steward.<noun>.<outcome>.v1 on
steward.outcomes.<worker>.<instance> (events.OutcomeType and
events.OutcomeSubject). An event has one outcome: its id is derived from
the worker, the instance and the event's sequence, so whatever a
redelivery emits again, the same or not, is not stored again (within the
outcomes stream's dedupe window) and the first stands.
Never put a secret in an outcome, a log line or an error.
*/
package workers
