package devstack

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/steward-dev/steward/internal/pgserver"
)

// Postgres is the provision worker's PostgreSQL in the stack: a private
// cluster the stack runs, a server WithDatabaseURL names, or none.
type Postgres struct {
	// URL is the server's connection string for provision; "" when there
	// is none, and then Why says why.
	URL string
	Why error
	// Given says URL came from WithDatabaseURL (the stack starts none).
	Given bool
	// Server is the private cluster, stopped with the stack; nil
	// otherwise. State says whether it was made now or reused (and what
	// was recovered), Took how long it took to come up.
	Server *pgserver.Server
	State  string
	Took   time.Duration
}

// startPostgres finds provision's PostgreSQL: databaseURL when given (the
// stack starts none), else a private cluster under <dir>/postgres from the
// machine's server binaries. It never falls back to the libpq defaults,
// which name the machine's shared server, whose roles and databases the
// test suite and other programs own.
func startPostgres(ctx context.Context, dir, databaseURL, pgBin string) *Postgres {
	if databaseURL != "" {
		return &Postgres{URL: databaseURL, Given: true}
	}
	bin, err := pgserver.FindBin(pgBin)
	if err != nil {
		if pgBin != "" {
			return &Postgres{Why: fmt.Errorf("--pg-bin %w; point it at PostgreSQL's server bin folder, or give --database-url", err)}
		}
		return &Postgres{Why: fmt.Errorf("%w; install them (apt-get install postgresql), point --pg-bin at them, or give --database-url", err)}
	}
	if os.Geteuid() == 0 {
		// The cluster runs as the postgres user, which must pass through
		// dir (made 0700) to reach <dir>/postgres; o+x lets it through
		// without letting it list or read anything else kept there.
		if fi, err := os.Stat(dir); err == nil && fi.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(dir, fi.Mode().Perm()|0o001); err != nil {
				return &Postgres{Why: fmt.Errorf("let the postgres user through --dir %s: %w; give a --dir it can enter, or --database-url", dir, err)}
			}
		}
	}
	began := time.Now()
	srv, err := pgserver.Start(ctx, pgserver.Options{Bin: bin, Dir: filepath.Join(dir, "postgres")})
	if err != nil {
		return &Postgres{Why: fmt.Errorf("the private PostgreSQL did not start: %w; fix that, or give --database-url", err)}
	}
	state := "reused"
	if srv.Initialised {
		state = "made now"
	}
	if srv.Recovered != "" {
		state += "; " + srv.Recovered
	}
	return &Postgres{URL: srv.URL("postgres"), Server: srv, State: state, Took: time.Since(began)}
}

// stop stops the private cluster, if the stack runs one.
func (p *Postgres) stop() error {
	if p.Server == nil {
		return nil
	}
	return p.Server.Stop()
}
