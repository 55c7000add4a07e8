package provision

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/agekey"
	"github.com/steward-dev/steward/internal/atomicfile"
	"github.com/steward-dev/steward/internal/signing"
)

// DevMachine is the machine name of the development instance.
const DevMachine = "dev-db"

// The development grant: one consumer, node app, granted database app.
const (
	devNode         = "app"
	devDatabase     = "app"
	devPasswordFile = "app-password"
	devGrantFile    = "grant.json"
)

// Dev prepares a development provision worker under dir/provision: the
// machine dev-db with an age identity (identity.txt), a development
// password (app-password) and a grant ready to publish (grant.json:
// generation 1, consumer node app granted database app, its password
// encrypted to the identity), all 0600, made once and then reused. The
// worker verifies grants with dev's controller key (dir/controller.pub,
// signing.DevControllerKey); grant.json is unsigned and the printed line
// publishes it with --signing-key dir/controller.key, which signs it.
// PostgreSQL is found through the libpq environment variables (PGHOST,
// PGPORT, PGUSER, ...); it is DevAt with no URL. When it does not answer,
// or answers as a user that is not a superuser, Dev returns the Config
// with an error saying why provision is not running; grant events then
// wait in the stream. The lines tell a newcomer how to publish the grant
// and connect as its role.
func Dev(ctx context.Context, dir string) (Config, []string, error) {
	return DevAt(ctx, dir, "")
}

// DevAt is Dev against the server of databaseURL (a pgx connection
// string for a superuser; empty: the libpq environment variables).
// `steward dev` passes its private cluster's URL or its --database-url, so
// that the libpq defaults, which name the machine's shared server, never
// decide where dev's roles and databases go.
func DevAt(ctx context.Context, dir, databaseURL string) (Config, []string, error) {
	base := filepath.Join(dir, Name)
	if err := os.MkdirAll(base, 0o700); err != nil {
		return Config{}, nil, fmt.Errorf("provision dev folder: %w", err)
	}
	path := filepath.Join(base, "identity.txt")
	id, newID, err := agekey.LoadOrGenerate(path)
	if err != nil {
		if _, serr := os.Stat(path); serr == nil {
			return Config{}, nil, fmt.Errorf("%w; move it away to have a new one made", err)
		}
		return Config{}, nil, fmt.Errorf("provision dev identity: %w", err)
	}
	recipient := id.Recipients()[0]
	passwordPath := filepath.Join(base, devPasswordFile)
	password, newPassword, err := devPassword(passwordPath)
	if err != nil {
		return Config{}, nil, err
	}
	grantPath := filepath.Join(base, devGrantFile)
	// A grant made for an identity or a password since replaced would be
	// refused or grant the wrong password, so it is made again.
	if err := devGrant(grantPath, recipient, password, newID || newPassword); err != nil {
		return Config{}, nil, err
	}
	signingKey, controllerPub, err := signing.DevControllerKey(dir)
	if err != nil {
		return Config{}, nil, fmt.Errorf("provision dev controller key: %w", err)
	}
	cfg := Config{Machine: DevMachine, AgeIdentity: path, DatabaseURL: databaseURL, RolePrefix: DefaultRolePrefix, ControllerKey: controllerPub}
	role := DefaultRolePrefix + devNode
	lines := []string{
		fmt.Sprintf("provision: machine %s, roles %s<node>; grants' passwords are age-encrypted (armored) to %s", DevMachine, DefaultRolePrefix, recipient),
		fmt.Sprintf("  grant database %s to role %s: go run ./cmd/steward publish --type %s --data @%s --signing-key %s", devDatabase, role, events.TypeGrantChanged, grantPath, signingKey),
		fmt.Sprintf(`  then connect: PGPASSWORD="$(cat %s)" psql "%s user=%s dbname=%s"`, passwordPath, devServer(databaseURL), role, devDatabase),
		`  a grant is the machine's whole state: to change it, publish a new grant with a higher "generation" (2, 3, ...); one not above the applied generation is skipped, and one not signed by a key of ` + controllerPub + ` is refused`,
	}
	if err := probe(ctx, databaseURL); err != nil {
		// pgx lists each address it tried on a line of its own.
		why := strings.Join(strings.Fields(err.Error()), " ")
		fix := "set PGHOST, PGPORT and PGUSER (a superuser)"
		if databaseURL != "" {
			fix = "start that server or give a URL of one that runs, as a superuser"
		}
		return cfg, lines, fmt.Errorf("provision is not running: %s; %s, and grant events wait in the stream until it runs", why, fix)
	}
	return cfg, lines, nil
}

// devPassword reads the development password at path, or makes one when
// the file is absent; created says which.
func devPassword(path string) (password string, created bool, err error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return "", false, fmt.Errorf("make a development password: %w", err)
		}
		password = "dev-" + hex.EncodeToString(b)
		err = atomicfile.WriteNew(path, []byte(password+"\n"), 0o600)
		if errors.Is(err, fs.ErrExist) {
			// Another `steward dev` made it meanwhile: use that one.
			return devPassword(path)
		}
		if err != nil {
			return "", false, err
		}
		return password, true, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read the development password: %w", err)
	}
	password = strings.TrimSpace(string(raw))
	ok := password != "" && len(password) <= maxPassword
	for _, c := range []byte(password) {
		ok = ok && c >= 0x20 && c <= 0x7e
	}
	if !ok {
		// Not quoted: it is a password.
		return "", false, fmt.Errorf("%s is not a password provision accepts (1 to %d printable ASCII characters); move it away to have a new one made", path, maxPassword)
	}
	return password, false, nil
}

// devGrant writes the development grant to path unless it is there
// already; replace writes it even then.
func devGrant(path, recipient, password string, replace bool) error {
	if !replace {
		if _, err := os.Stat(path); err == nil {
			return nil
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("read the development grant: %w", err)
		}
	}
	secret, err := agekey.Encrypt(recipient, []byte(password))
	if err != nil {
		return fmt.Errorf("development grant: %w", err)
	}
	g := events.GrantChanged{Machine: DevMachine, Requirement: "postgres", Generation: 1, Given: []events.Given{{
		From: "dev", Node: devNode, Values: events.GivenValues{Name: devDatabase}, Secret: secret,
	}}}
	data, err := json.MarshalIndent(g, "", "  ")
	if err != nil {
		return fmt.Errorf("development grant: %w", err)
	}
	data = append(data, '\n')
	if replace {
		return atomicfile.Write(path, data, 0o600)
	}
	if err := atomicfile.WriteNew(path, data, 0o600); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return nil
}

// devServer is the host (and port, when not the default) to connect to
// as the granted role: the TCP host of databaseURL (or of the libpq
// settings when it is empty), or 127.0.0.1 when they name a socket, where
// the server would check the role by its OS user rather than its password.
func devServer(databaseURL string) string {
	host, port := "127.0.0.1", uint16(5432)
	if cc, err := pgx.ParseConfig(databaseURL); err == nil {
		if cc.Host != "" && !strings.HasPrefix(cc.Host, "/") {
			host = cc.Host
		}
		port = cc.Port
	}
	if port != 5432 {
		return fmt.Sprintf("host=%s port=%d", host, port)
	}
	return "host=" + host
}

// probe connects to databaseURL (empty: the libpq defaults) and checks
// the user can do a provision worker's work.
func probe(ctx context.Context, databaseURL string) error {
	cc, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		if databaseURL != "" {
			// Not %w: pgx's parse error quotes the URL, password and all.
			return errors.New("the database URL does not parse as a pgx connection string (postgres://user@host:port/db or key=value)")
		}
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
