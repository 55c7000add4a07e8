package provision

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"filippo.io/age"
	"github.com/jackc/pgx/v5"

	"github.com/steward-dev/steward/internal/atomicfile"
)

// DevMachine is the machine name of the development instance.
const DevMachine = "dev-db"

// Dev prepares a development provision worker under dir: the machine
// dev-db with an age identity in dir/provision/identity.txt (created once,
// then reused). PostgreSQL is found through the libpq environment
// variables (PGHOST, PGPORT, PGUSER, ...). When it does not answer, or
// answers as a user that is not a superuser, Dev returns the Config with
// an error saying why provision is not running; grant events then wait in
// the stream. The lines tell a newcomer how to publish a grant.
func Dev(ctx context.Context, dir string) (Config, []string, error) {
	idDir := filepath.Join(dir, Name)
	if err := os.MkdirAll(idDir, 0o700); err != nil {
		return Config{}, nil, fmt.Errorf("provision dev folder: %w", err)
	}
	path := filepath.Join(idDir, "identity.txt")
	id, err := devIdentity(path)
	if err != nil {
		return Config{}, nil, err
	}
	cfg := Config{Machine: DevMachine, AgeIdentity: path, RolePrefix: DefaultRolePrefix}
	recipient := id.Recipient().String()
	lines := []string{
		fmt.Sprintf("provision: machine %s, roles %s<node>; each consumer's password must be age-encrypted (armored) to %s:", DevMachine, DefaultRolePrefix, recipient),
		fmt.Sprintf(`  secret=$(printf %%s 'a-password' | age --armor -r %s)`, recipient),
		fmt.Sprintf(`  go run ./cmd/steward publish dev.steward.grant.changed.v1 %s "$(jq -cn --arg s "$secret" '{machine:"%s",requirement:"postgres",generation:1,given:[{from:"dev",node:"app",values:{name:"app"},secret:$s}]}')"`, DevMachine, DevMachine),
		"  each grant is the whole state: publish generation 2, 3, ... to change it",
	}
	if err := probe(ctx); err != nil {
		// pgx lists each address it tried on a line of its own.
		why := strings.Join(strings.Fields(err.Error()), " ")
		return cfg, lines, fmt.Errorf("provision is not running: %s; set PGHOST, PGPORT and PGUSER (a superuser) or --database-url, and grant events wait in the stream until it runs", why)
	}
	return cfg, lines, nil
}

// devIdentity reads the development identity, or creates it when absent.
// An existing file that does not parse is an error, never overwritten.
func devIdentity(path string) (*age.X25519Identity, error) {
	raw, err := os.ReadFile(path)
	switch {
	case err == nil:
		ids, perr := age.ParseIdentities(bytes.NewReader(raw))
		if perr != nil || len(ids) == 0 {
			return nil, fmt.Errorf("%s exists but holds no age identity; move it away to have a new one made", path)
		}
		x, ok := ids[0].(*age.X25519Identity)
		if !ok {
			return nil, fmt.Errorf("%s holds an age identity that is not X25519; move it away to have a new one made", path)
		}
		return x, nil
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	id, err := age.GenerateX25519Identity()
	if err != nil {
		return nil, fmt.Errorf("generate an age identity: %w", err)
	}
	content := fmt.Sprintf("# created: %s\n# public key: %s\n%s\n", time.Now().UTC().Format(time.RFC3339), id.Recipient(), id)
	if err := atomicfile.Write(path, []byte(content), 0o600); err != nil {
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	return id, nil
}

// probe connects with the libpq defaults and checks the user can do a
// provision worker's work.
func probe(ctx context.Context) error {
	cc, err := pgx.ParseConfig("")
	if err != nil {
		return fmt.Errorf("the libpq settings do not parse: %w", err)
	}
	target := fmt.Sprintf("PostgreSQL at %s:%d as %s", cc.Host, cc.Port, cc.User)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return fmt.Errorf("%s does not answer: %w", target, err)
	}
	defer conn.Close(context.Background())
	var super bool
	if err := conn.QueryRow(ctx, "SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user").Scan(&super); err != nil {
		return fmt.Errorf("%s answers but its user cannot be read: %w", target, err)
	}
	if !super {
		return fmt.Errorf("%s answers but the user is not a superuser, and provision reads pg_authid and creates roles and databases", target)
	}
	return nil
}
