// Package natsauth is who may say what on Steward's bus: the identities
// (an operator, publishers, one identity per worker instance), the NATS
// subjects each may publish and subscribe to, and the issuing of NATS
// credentials (decentralised JWT authentication) that carry those
// permissions, so a fleet gets identities without editing the server's
// configuration.
//
// The bus is closed: everything an identity is not allowed here, the
// server refuses. What JetStream's API cannot scope per instance is said
// where it is granted.
package natsauth

import (
	"fmt"
	"strings"

	"github.com/steward-dev/steward/events"
)

// CheckpointBucket is the KV bucket the runtime keeps checkpoints, stages
// and status documents in (events.CheckpointBucket).
const CheckpointBucket = events.CheckpointBucket

// Role is what an identity is for.
type Role string

// The roles. An operator runs setup, dlq, status, replay and export; a
// publisher (a console, a pipeline, the HTTP ingress) publishes events; a
// worker instance applies them; a site's leaf node links the site to the
// hub.
const (
	RoleOperator  Role = "operator"
	RolePublisher Role = "publisher"
	RoleWorker    Role = "worker"
	RoleLeaf      Role = "leaf"
)

// Identity is one holder of credentials on the bus.
type Identity struct {
	Role Role
	// Worker and Instance name a worker instance (RoleWorker only): the
	// worker ("converge") and its instance ("install-7").
	Worker, Instance string
	// Site and HubDomain name a site's leaf node (RoleLeaf only): the
	// site, its JetStream domain, and the hub's domain it sources from.
	Site, HubDomain string
}

// Operator is the identity that may use the whole JetStream API.
func Operator() Identity { return Identity{Role: RoleOperator} }

// Publisher is the identity that may publish events and nothing else.
func Publisher() Identity { return Identity{Role: RolePublisher} }

// Worker is the identity of one worker instance. Both names must be keys
// (one subject token), as the runtime requires of them.
func Worker(worker, instance string) (Identity, error) {
	if err := events.CheckKey(worker); err != nil {
		return Identity{}, fmt.Errorf("worker name: %w", err)
	}
	if err := events.CheckKey(instance); err != nil {
		return Identity{}, fmt.Errorf("worker %s instance: %w", worker, err)
	}
	return Identity{Role: RoleWorker, Worker: worker, Instance: instance}, nil
}

// Name names the identity: "operator", "publisher", or the worker
// instance's consumer name "<worker>-<instance>". It is the user's name in
// its credentials and the last part of its inbox prefix.
func (id Identity) Name() string {
	switch id.Role {
	case RoleWorker:
		return id.Worker + "-" + id.Instance
	case RoleLeaf:
		return "leaf-" + id.Site
	}
	return string(id.Role)
}

// InboxPrefix is the prefix of the reply subjects the identity's
// connection must use (nats.CustomInboxPrefix): replies to a worker's
// requests (pull batches with the events, KV reads with its checkpoints,
// publish acknowledgements) go to subjects only that identity may
// subscribe to, so no other identity can read them. The operator reads
// everything anyway and keeps the default, so the nats CLI works as it is.
func (id Identity) InboxPrefix() string {
	if id.Role == RoleOperator {
		return "_INBOX"
	}
	return "_INBOX." + id.Name()
}

// Permissions are the subjects an identity may publish to and subscribe
// to. Everything else is denied.
type Permissions struct {
	Publish   []string
	Subscribe []string
}

// Permissions are the identity's subjects (docs/design.md §7).
func (id Identity) Permissions() Permissions {
	inbox := id.InboxPrefix() + ".>"
	switch id.Role {
	case RoleOperator:
		return Permissions{Publish: []string{">"}, Subscribe: []string{">"}}
	case RolePublisher:
		return Permissions{Publish: publisherPublish(), Subscribe: []string{inbox}}
	case RoleWorker:
		// The stored notices (headers only: subject and sequence) wake a
		// fleet instance reading the stream. Any worker may read any
		// event by sequence already, so hearing of all of them grants
		// nothing more.
		return Permissions{Publish: workerPublish(id.Worker, id.Instance), Subscribe: []string{inbox, events.StoredPrefix + ".>", "steward.control." + id.Worker + "." + id.Instance}}
	case RoleLeaf:
		return leafPermissions(id.Site, id.HubDomain)
	}
	return Permissions{}
}

// publisherPublish is what a publisher (a pipeline, the ingress) sends.
func publisherPublish() []string {
	return []string{
		// Core or JetStream publishes of events; the inbox is for the
		// stream's acknowledgements.
		events.EventsPrefix + ".>",
		// The ingress signs a version or generation only within its
		// caller's window above the newest signed event stored on that
		// key (internal/tokens), so it reads that one event: a direct get
		// of the last message by subject, the subject being in the API
		// subject, so the grant reaches STEWARD_EVENTS and event subjects
		// only. Events are desired state, and what is secret in them is
		// encrypted to its one recipient. Not granted: the body form of
		// the direct get (by sequence, or any subject), which could not be
		// scoped, and every other JetStream API: a publisher cannot list
		// a stream, read a checkpoint or touch a consumer.
		"$JS.API.DIRECT.GET." + events.StreamEvents + "." + events.EventsPrefix + ".>",
		// Every signature the ingress makes for a caller is an audit event
		// on steward.outcomes.ingress.<token> (tokens.AuditWorker): no
		// worker is named ingress, so these subjects are no instance's.
		events.OutcomesPrefix + ".ingress.>",
	}
}

// workerPublish is what the runtime sends, and nothing more.
func workerPublish(worker, instance string) []string {
	consumer := worker + "-" + instance
	ev := events.StreamEvents
	kv := "$KV." + CheckpointBucket + "."
	direct := "$JS.API.DIRECT.GET.KV_" + CheckpointBucket + "." + kv
	var out []string
	// Look, never change: a worker checks that the streams and the bucket
	// it needs exist. Creating and updating them is the operator's
	// (steward setup).
	for _, s := range []string{events.StreamEvents, events.StreamOutcomes, events.StreamDLQ, "KV_" + CheckpointBucket} {
		out = append(out, "$JS.API.STREAM.INFO."+s)
	}
	out = append(out,
		// Its own durable consumer only: the name is in the subject, and
		// the server refuses a body naming another. The filter is not
		// scoped: with several filter subjects the API subject carries
		// none, so an instance could point its own consumer at another
		// instance's events (it still acks only its own consumer).
		"$JS.API.CONSUMER.CREATE."+ev+"."+consumer,
		"$JS.API.CONSUMER.CREATE."+ev+"."+consumer+".>",
		"$JS.API.CONSUMER.DURABLE.CREATE."+ev+"."+consumer,
		"$JS.API.CONSUMER.INFO."+ev+"."+consumer,
		"$JS.API.CONSUMER.MSG.NEXT."+ev+"."+consumer,
		"$JS.ACK."+ev+"."+consumer+".>",
		// The order check reads STEWARD_EVENTS by sequence. Neither form
		// of the read can be scoped to subjects (the subject filter is in
		// the request's body), so any worker may read any event: events
		// are desired state, and what is secret in them is encrypted to
		// its one recipient.
		"$JS.API.STREAM.MSG.GET."+ev,
		"$JS.API.DIRECT.GET."+ev,
		"$JS.API.DIRECT.GET."+ev+".>",
	)
	// Its own checkpoints, stages and status document: written by
	// publishing to the key's subject, read by a direct get that names the
	// key in its subject (the bucket allows direct gets, as nats.go makes
	// buckets). The non-direct read, STREAM.MSG.GET on the bucket, would
	// name no key, so it is not granted.
	for _, key := range events.InstanceKeys(worker, instance) {
		out = append(out, kv+key, direct+key)
	}
	// The upgrade record, read only: it says which unsigned documents are
	// the previous version's. Only the operator writes it, and a reader
	// believes it only with the operator's signature.
	out = append(out, direct+events.UpgradeKey)
	return append(out, events.OutcomeSubject(worker, instance), events.DLQSubject(worker, instance))
}

// Table is the permission table as markdown, for the README and the
// design document: what each identity may publish and subscribe to.
func Table() string {
	w := Identity{Role: RoleWorker, Worker: "<w>", Instance: "<i>"}
	l := Identity{Role: RoleLeaf, Site: "<site>", HubDomain: "<hub>"}
	var b strings.Builder
	b.WriteString("| identity | may publish to | may subscribe to |\n|---|---|---|\n")
	for _, id := range []Identity{Operator(), Publisher(), w, l} {
		p := id.Permissions()
		fmt.Fprintf(&b, "| %s | `%s` | `%s` |\n", id.Name(), strings.Join(p.Publish, "`, `"), strings.Join(p.Subscribe, "`, `"))
	}
	return b.String()
}
