package provision

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/agekey"
)

// consumer is one validated consumer of a grant.
type consumer struct {
	node     string
	role     string
	database string
	password string
}

// maxPassword bounds a decrypted password. PostgreSQL has no limit of its
// own; a megabyte "password" is a mistake or an attack.
const maxPassword = 1024

// reservedDatabases are never handed to a consumer: the server's own.
var reservedDatabases = []string{"postgres", "template0", "template1"}

// plan validates every consumer of g and returns them in a stable order
// (by node). Any failure refuses the whole grant: nothing is changed for
// the valid consumers either, since the grant is one desired state.
func (w *Worker) plan(g events.GrantChanged) ([]consumer, *refusal) {
	nodes := make(map[string]bool, len(g.Given))
	dbs := make(map[string]string, len(g.Given))
	out := make([]consumer, 0, len(g.Given))
	for _, given := range g.Given {
		ref := func(rule, format string, args ...any) *refusal {
			return &refusal{Refused{Machine: w.machine, Generation: g.Generation, Consumer: given.Node, Rule: rule,
				Reason: fmt.Sprintf("consumer %q: ", given.Node) + fmt.Sprintf(format, args...)}}
		}
		if err := events.CheckKey(given.Node); err != nil {
			return nil, ref("node-key", "the node name is not a key (%v), and it becomes part of a role name", err)
		}
		if nodes[given.Node] {
			return nil, ref("duplicate-node", "the node is granted twice; one node has one role, so the grant is ambiguous")
		}
		nodes[given.Node] = true
		role := w.prefix + given.Node
		if len(role) > maxIdentifier {
			return nil, ref("role-name-length", "role %q is %d bytes; PostgreSQL would truncate it to %d, so give the node a shorter name", role, len(role), maxIdentifier)
		}
		db := given.Values.Name
		if rule, why := checkDatabaseName(db); rule != "" {
			return nil, ref(rule, "database name %q %s", db, why)
		}
		if other, ok := dbs[db]; ok {
			return nil, ref("duplicate-database", "database %q is also granted to node %q; a database has one owner", db, other)
		}
		dbs[db] = given.Node
		if given.Secret == "" {
			return nil, ref("secret-missing", "no secret was granted; a role is never created without a password")
		}
		password, rule, why := w.decrypt(given.Secret)
		if rule != "" {
			return nil, ref(rule, "%s", why)
		}
		out = append(out, consumer{node: given.Node, role: role, database: db, password: password})
	}
	slices.SortFunc(out, func(a, b consumer) int { return strings.Compare(a.node, b.node) })
	return out, nil
}

// checkDatabaseName returns the rule a database name breaks and why, or
// "" when it is acceptable. Any printable name is accepted and quoted, so
// quotes, semicolons, inner spaces and unicode are kept exactly; what is
// refused is what PostgreSQL would alter (NUL, over 63 bytes), what tools
// and logs would show as something else (control, format and invisible
// characters, leading or trailing spaces), and the server's own databases.
func checkDatabaseName(name string) (rule, why string) {
	switch {
	case name == "":
		return "database-name-empty", "is empty"
	case !utf8.ValidString(name):
		return "database-name-character", "is not valid UTF-8"
	case len(name) > maxIdentifier:
		return "database-name-length", fmt.Sprintf("is %d bytes; PostgreSQL would truncate it to %d", len(name), maxIdentifier)
	}
	for _, r := range name {
		// IsPrint admits letters, marks, numbers, punctuation, symbols and
		// the ASCII space; NUL, controls, bidi overrides, zero-width and
		// other spaces fail it.
		if !unicode.IsPrint(r) {
			return "database-name-character", fmt.Sprintf("holds %U, which is not a printable character", r)
		}
	}
	if strings.TrimSpace(name) != name {
		return "database-name-space", "begins or ends with a space, which no listing shows"
	}
	if slices.Contains(reservedDatabases, name) {
		return "database-name-reserved", "is one of the server's own databases"
	}
	return "", ""
}

// decrypt opens a consumer's secret with the machine's identity and checks
// the password. The rule and reason never hold the password, and agekey's
// errors never quote a line of the secret.
func (w *Worker) decrypt(secret string) (password, rule, why string) {
	plain, err := w.id.Decrypt(secret)
	defer clear(plain)
	switch {
	case errors.Is(err, agekey.ErrNoMatch):
		return "", "secret-undecryptable", fmt.Sprintf("the secret is encrypted to another key, not to this machine's age identity; encrypt it to %s", strings.Join(w.id.Recipients(), " or "))
	case errors.Is(err, agekey.ErrTooLarge):
		return "", "password-length", fmt.Sprintf("the password is over %d bytes", maxPassword)
	case err != nil:
		return "", "secret-undecryptable", fmt.Sprintf("the secret does not decrypt with this machine's age identity: %v", err)
	}
	switch {
	case len(plain) == 0:
		return "", "password-empty", "the secret decrypts to an empty password"
	case len(plain) > maxPassword:
		return "", "password-length", fmt.Sprintf("the password is over %d bytes", maxPassword)
	}
	for _, c := range plain {
		// Printable ASCII only: for it SASLprep is the identity, so the
		// verifier Steward computes is the one every client derives. A
		// newline or other control byte is nearly always a mistake.
		if c < 0x20 || c > 0x7e {
			return "", "password-character", "the password holds a byte outside printable ASCII (0x20-0x7e); a trailing newline (echo without -n) is the usual cause"
		}
	}
	return string(plain), "", ""
}
