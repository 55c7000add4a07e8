// Package provision is the worker that makes a PostgreSQL server hold
// exactly the roles and databases a grant.changed event describes.
//
// Each grant is the whole desired state of one machine. The worker
// reconciles, never applies a delta: every consumer gets a role
// <prefix><node> that can log in with its granted password and a database
// it owns, closed to every other role (PUBLIC's privileges on it are
// revoked when it is created); every other role carrying the prefix is
// made NOLOGIN (never dropped) and its open sessions are ended; roles
// without the prefix are never touched. A marked role is the
// provisioner's, so every run takes from it any power a consumer's role
// never has (SUPERUSER, CREATEDB, CREATEROLE, REPLICATION, BYPASSRLS, any
// membership) before it gets a password. Reconciles of one machine are
// serialised by a row lock only a superuser can take, with lock_timeout
// and statement_timeout on every statement. Passwords are sent to the server only as SCRAM-SHA-256
// verifiers Steward computes itself, so no plaintext reaches the server's
// logs or pg_stat_statements.
//
// A grant counts only when the controller signed it (docs/design.md §7): the
// machine's recipient is public, so a grant that is unsigned, does not
// verify with a key of --controller-key, names another machine or disagrees
// with the event's fields is refused before its generation is compared or
// anything is changed, and ranks nowhere. A machine pinned by a signed
// mistake (a generation far above the controller's) is reset by deleting
// its row of steward.provision_generation (see the README); the next signed
// grant of any generation is then reconciled in full.
package provision

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/pflag"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/agekey"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers"
)

// Name is the worker's name: its consumer is provision-<machine>.
const Name = "provision"

// DefaultRolePrefix marks the roles Steward owns.
const DefaultRolePrefix = "mesh_"

// OutcomeNoun starts the provision worker's outcome types: they are
// dev.steward.grant.<outcome>.v1, published on steward.outcomes.provision.<machine>.
const OutcomeNoun = "grant"

// Outcome names, emitted as dev.steward.grant.<outcome>.v1.
const (
	OutcomeApplied = "applied"
	OutcomeRefused = "refused"
	OutcomeSkipped = "skipped"
)

// Config is a provision worker's configuration.
type Config struct {
	// Machine is the name grants address this PostgreSQL server by.
	Machine string
	// ControllerKey is the controller's ed25519 public key set that signs
	// grants: a PEM file holding one or more PUBLIC KEY blocks, or several
	// files separated by commas (signing.LoadEnvelopeKeys).
	ControllerKey string
	// AgeIdentity is the file holding the machine's age identity, as
	// age-keygen writes it; grants' secrets are encrypted to it.
	AgeIdentity string
	// DatabaseURL is a pgx connection string (URL or key=value). When
	// empty, the libpq environment variables (PGHOST, PGUSER, ...) decide.
	// The user must be a superuser: it reads pg_authid and creates roles
	// and databases owned by them.
	DatabaseURL string
	// RolePrefix marks the roles this worker owns (default "mesh_").
	RolePrefix string
}

// AddFlags registers the configuration's flags (docs/design.md §6:
// STEWARD_MACHINE, STEWARD_AGE_IDENTITY, STEWARD_DATABASE_URL,
// STEWARD_ROLE_PREFIX; issue 12 adds STEWARD_CONTROLLER_KEY).
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	if c.RolePrefix == "" {
		c.RolePrefix = DefaultRolePrefix
	}
	fs.StringVar(&c.Machine, "machine", c.Machine, "the machine this PostgreSQL server is granted as (a key: letters, digits, '_' and '-')")
	fs.StringVar(&c.ControllerKey, "controller-key", c.ControllerKey, "the controller's ed25519 public keys (PEM) that sign grants: one file with one or more PUBLIC KEY blocks, or files separated by commas; an unsigned grant is refused")
	fs.StringVar(&c.AgeIdentity, "age-identity", c.AgeIdentity, "file holding the machine's age identity; grants' passwords are encrypted to its recipient")
	fs.StringVar(&c.DatabaseURL, "database-url", c.DatabaseURL, "PostgreSQL connection string for a superuser (empty: the libpq variables PGHOST, PGPORT, PGUSER, ... decide)")
	fs.StringVar(&c.RolePrefix, "role-prefix", c.RolePrefix, "prefix marking the roles Steward owns; roles without it are never touched")
}

// maxIdentifier is PostgreSQL's identifier limit in bytes (NAMEDATALEN-1);
// longer names are silently truncated by the server, so they are refused.
const maxIdentifier = 63

// prefixPattern keeps the mark a plain lower-case word: it is compared
// byte for byte with role names, and must never be empty (an empty mark
// would claim every role on the server).
var prefixPattern = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)

// Worker reconciles one machine's PostgreSQL server with its grants.
type Worker struct {
	machine string
	prefix  string
	id      *agekey.Identity
	// keys are the controller keys a grant must be signed by.
	keys *signing.KeySet
	pool *pgxpool.Pool
	// dbTarget names the server for messages (host, port, user; never a
	// password).
	dbTarget string
	// tableReady is set once the generation and lock tables are known to
	// exist with a superuser owner.
	tableReady atomic.Bool
	// running holds one token while a reconcile runs: each takes two of
	// the pool's connections, so two at once could starve each other.
	running chan struct{}
	// lockTimeout and statementTimeout bound every statement the
	// reconcile sends (defaultLockTimeout, defaultStatementTimeout).
	lockTimeout, statementTimeout time.Duration
}

// New validates cfg, reads the age identity and prepares a connection
// pool. It does not connect: a server that is down is retried per event.
func New(cfg Config) (*Worker, error) {
	return newWorker(cfg, nil)
}

func newWorker(cfg Config, tracer pgx.QueryTracer) (*Worker, error) {
	if err := events.CheckKey(cfg.Machine); err != nil {
		return nil, fmt.Errorf("--machine: %w", err)
	}
	if cfg.RolePrefix == "" {
		cfg.RolePrefix = DefaultRolePrefix
	}
	if !prefixPattern.MatchString(cfg.RolePrefix) {
		return nil, fmt.Errorf("--role-prefix %q must match %s (a lower-case letter, then up to 31 lower-case letters, digits or '_')", cfg.RolePrefix, prefixPattern)
	}
	if strings.HasPrefix(cfg.RolePrefix, "pg_") {
		return nil, fmt.Errorf("--role-prefix %q starts with pg_, which PostgreSQL reserves for its own roles", cfg.RolePrefix)
	}
	if cfg.AgeIdentity == "" {
		return nil, errors.New("--age-identity is required: the file holding the machine's age identity that grants' passwords are encrypted to")
	}
	id, err := agekey.Load(cfg.AgeIdentity)
	if err != nil {
		return nil, fmt.Errorf("--age-identity: %w", err)
	}
	if strings.TrimSpace(cfg.ControllerKey) == "" {
		return nil, errors.New("--controller-key is required: the controller's ed25519 public key (PEM) that signs grants (steward keys --kind controller makes a pair); the machine's recipient is public, so an unsigned grant proves nothing")
	}
	keys, err := signing.LoadEnvelopeKeys(cfg.ControllerKey)
	if err != nil {
		return nil, fmt.Errorf("--controller-key: %w", err)
	}
	pc, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		// pgconn redacts the password from its parse errors.
		return nil, fmt.Errorf("--database-url: %w", err)
	}
	// One reconcile at a time holds two connections: one keeps the lock
	// transaction open while the other runs CREATE DATABASE, which no
	// transaction may hold.
	pc.MaxConns = 2
	if _, ok := pc.ConnConfig.RuntimeParams["application_name"]; !ok {
		pc.ConnConfig.RuntimeParams["application_name"] = "steward-provision"
	}
	pc.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, fmt.Errorf("--database-url: %w", err)
	}
	return &Worker{
		machine:  cfg.Machine,
		prefix:   cfg.RolePrefix,
		id:       id,
		keys:     keys,
		pool:     pool,
		dbTarget: fmt.Sprintf("PostgreSQL at %s:%d as %s", pc.ConnConfig.Host, pc.ConnConfig.Port, pc.ConnConfig.User),
		running:  make(chan struct{}, 1),

		lockTimeout:      defaultLockTimeout,
		statementTimeout: defaultStatementTimeout,
	}, nil
}

// Spec says the worker consumes grant.changed for its machine only.
func (w *Worker) Spec() workers.Spec {
	s := SpecFor(w.machine)
	// A grant is the whole desired state of the machine: of several not
	// yet applied, only the newest generation matters.
	s.Rank = w.rank
	return s
}

// SpecFor is the Spec of the worker of machine without its Rank, which
// needs the controller keys: what a dry run (steward replay --dry-run, which
// decodes and validates and handles nothing) reads the instance's subjects
// with.
func SpecFor(machine string) workers.Spec {
	k, _ := events.Lookup(events.TypeGrantChanged)
	return workers.Spec{
		Name:     Name,
		Instance: machine,
		Subjects: []string{k.FilterSubject(machine)},
		Types:    []string{events.TypeGrantChanged},
		// The catalog names these outcomes grant.applied and grant.refused.
		OutcomeNoun: OutcomeNoun,
		// A grant at or below the applied generation changes nothing.
		Unchanged: []string{OutcomeSkipped},
	}
}

// rank is a grant's place in its machine's order, its generation, once it
// passes the checks Handle refuses by (the controller's signature among
// them); a grant that fails them ranks nowhere and supersedes nothing, so
// an unsigned huge generation holds back no real one.
func (w *Worker) rank(_ context.Context, d *workers.Delivery) (uint64, error) {
	var g events.GrantChanged
	if err := d.DataAs(&g); err != nil {
		return 0, err
	}
	if r := w.checkGrant(g); r != nil {
		return 0, r
	}
	// Every consumer too (secret present and opening, names valid): a
	// grant Handle would refuse must not supersede one it would apply.
	if _, r := w.plan(g); r != nil {
		return 0, r
	}
	return g.Generation, nil
}

// Close closes the connection pool.
func (w *Worker) Close() error {
	w.pool.Close()
	return nil
}

// Names lists what an outcome is about, by name only.
type Names struct {
	Roles     []string `json:"roles"`
	Databases []string `json:"databases"`
}

func newNames() Names { return Names{Roles: []string{}, Databases: []string{}} }

// Applied is the data of a grant.applied outcome: what the reconcile
// of one generation did.
type Applied struct {
	Machine    string `json:"machine"`
	Generation uint64 `json:"generation"`
	// Created are the roles and databases that did not exist.
	Created Names `json:"created"`
	// Altered are the roles whose login or password had to change, and
	// the databases a creation cut short had left open to PUBLIC.
	Altered Names `json:"altered"`
	// Revoked are the marked roles no longer granted, made NOLOGIN.
	Revoked Names `json:"revoked"`
	// Unchanged are the granted roles and databases already as granted.
	Unchanged Names `json:"unchanged"`
	// Normalised are the marked roles (granted or not) found with powers
	// or memberships the provisioner never grants, and what was taken.
	Normalised []Normalised `json:"normalised"`
	// SessionsEnded counts the sessions of roles no longer granted that
	// were ended (pg_terminate_backend): NOLOGIN alone stops only new
	// ones. A password rotation ends none.
	SessionsEnded int `json:"sessionsEnded"`
	// BlockingSessionsEnded counts the sessions of a marked role that held
	// its own catalog row (an ALTER ROLE on itself left uncommitted)
	// against the reconcile, and were ended so it could go on.
	BlockingSessionsEnded int `json:"blockingSessionsEnded"`
}

// Normalised is one marked role whose powers were taken before it was
// granted or revoked.
type Normalised struct {
	Role string `json:"role"`
	// Attributes are the attributes it had and lost (SUPERUSER, CREATEDB,
	// CREATEROLE, REPLICATION, BYPASSRLS).
	Attributes []string `json:"attributes"`
	// Memberships are the roles it was a member of and no longer is.
	Memberships []string `json:"memberships"`
}

// Refused is the data of a grant.refused outcome. Nothing was changed.
type Refused struct {
	Machine    string `json:"machine"`
	Generation uint64 `json:"generation"`
	// Consumer is the node of the consumer that broke the rule ("" when
	// the grant as a whole did).
	Consumer string `json:"consumer"`
	// Rule names the rule broken (e.g. "database-name-length").
	Rule string `json:"rule"`
	// Reason says what was found and what to do about it.
	Reason string `json:"reason"`
}

// Skipped is the data of a grant.skipped outcome: the generation is
// not above the one already applied to this server.
type Skipped struct {
	Machine    string `json:"machine"`
	Generation uint64 `json:"generation"`
	Applied    uint64 `json:"appliedGeneration"`
}

// refusal is a grant no retry can make acceptable.
type refusal struct{ Refused }

func (r *refusal) Error() string {
	msg := fmt.Sprintf("%s; generation %d for machine %s was refused and nothing was changed", r.Reason, r.Generation, r.Machine)
	if r.Consumer != "" {
		msg += " (publish the corrected grant as a new generation)"
	}
	return msg
}

// Handle reconciles the server with one grant.changed event and reports
// it: grant.applied, grant.skipped (a generation not above the applied
// one), or grant.refused, returned as workers.Refused so the runtime
// settles it. Any other error is retried.
func (w *Worker) Handle(ctx context.Context, d *workers.Delivery) error {
	var g events.GrantChanged
	if err := d.DataAs(&g); err != nil {
		return err
	}
	res, err := w.reconcile(ctx, g)
	var r *refusal
	switch {
	case errors.As(err, &r):
		if eerr := d.Emit(ctx, OutcomeRefused, r.Refused); eerr != nil {
			err = eerr
			break
		}
		// The grant.refused outcome is out: the runtime settles the
		// event, and a redelivery would only be refused again.
		return workers.Refused(fmt.Errorf("grant for %s (event %s): %w", d.Key, d.Event.ID(), r))
	case err != nil:
	case res.skipped != nil:
		o := *res.skipped
		d.Log.Info().Uint64("generation", o.Generation).Uint64("applied_generation", o.Applied).Msg("grant not above the applied generation; skipped")
		err = d.Emit(ctx, OutcomeSkipped, o)
	default:
		o := *res.applied
		d.Log.Info().Uint64("generation", o.Generation).
			Int("created", len(o.Created.Roles)+len(o.Created.Databases)).Int("altered", len(o.Altered.Roles)).
			Int("revoked", len(o.Revoked.Roles)).Int("unchanged", len(o.Unchanged.Roles)).
			Int("normalised", len(o.Normalised)).Int("sessions_ended", o.SessionsEnded).
			Int("blocking_sessions_ended", o.BlockingSessionsEnded).Msg("grant applied")
		err = d.Emit(ctx, OutcomeApplied, o)
	}
	if err != nil {
		return fmt.Errorf("grant for %s (event %s): %w", d.Key, d.Event.ID(), err)
	}
	return nil
}

// checkGrant refuses what concerns the grant as a whole: another machine,
// then anything the controller did not sign exactly as the event says
// (before the generation is believed), then the requirement and the
// generation's range.
func (w *Worker) checkGrant(g events.GrantChanged) *refusal {
	ref := func(rule, reason string) *refusal {
		return &refusal{Refused{Machine: w.machine, Generation: g.Generation, Rule: rule, Reason: reason}}
	}
	if g.Machine != w.machine {
		return ref("machine", fmt.Sprintf("the grant is for machine %q but this worker provisions %q, so it was not applied here", g.Machine, w.machine))
	}
	if _, err := signing.OpenGrant(w.keys, g); err != nil {
		rule, what := signing.RuleSignature, "is not accepted as the controller's"
		var se *signing.StateError
		if errors.As(err, &se) {
			rule = se.Rule
		}
		if rule == signing.RuleUnsigned {
			what = "is not signed by the controller"
		}
		return ref(rule, fmt.Sprintf("generation %d for machine %s %s (%v), so nothing was changed and its generation counts for nothing; republish it signed with a key of --controller-key (steward publish --signing-key)",
			g.Generation, w.machine, what, err))
	}
	switch {
	case g.Requirement != "postgres":
		return ref("requirement", fmt.Sprintf("the grant requires %q but this worker provisions only \"postgres\"", g.Requirement))
	case g.Generation == 0 || g.Generation > math.MaxInt64:
		return ref("generation", fmt.Sprintf("generation %d is outside 1..%d", g.Generation, int64(math.MaxInt64)))
	}
	return nil
}
