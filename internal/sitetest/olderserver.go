package sitetest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/steward-dev/steward/internal/fleet"
)

// OlderServer returns the client URL of a proxy to s that tells every
// client, in each INFO s sends it, that s runs nats-server version;
// everything else passes through untouched. The tests embed only
// the module's nats-server, so this is how a hub or a leaf node on an
// older release, one that events.CheckSiteServer warns of, looks to
// `steward site setup` and `steward status`. The proxy and its
// connections close when the test ends.
func OlderServer(t testing.TB, s *server.Server, version string) string {
	t.Helper()
	p, err := fleet.StartLinkProxy(s.Addr().String(), fleet.FromTarget(func(dst io.Writer, src io.Reader) error {
		return claimVersion(dst, bufio.NewReader(src), version)
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Cut)
	return "nats://" + p.Addr()
}

// claimVersion copies what the server sends from r to w, with version in
// place of the server's own in every INFO: the greeting, and the one the
// server sends with its first PONG (ConnectInfo), which a client reads
// over the greeting's. A message's payload is copied as it is, by the
// size its MSG or HMSG line gives.
func claimVersion(w io.Writer, r *bufio.Reader, version string) error {
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return err
		}
		op, rest, _ := strings.Cut(strings.TrimRight(line, "\r\n"), " ")
		switch strings.ToUpper(op) {
		case "INFO":
			if line, err = infoClaiming(rest, version); err != nil {
				return err
			}
		case "MSG", "HMSG":
			fields := strings.Fields(rest)
			if len(fields) < 3 {
				return fmt.Errorf("the server's %s line %q gives no size", op, line)
			}
			size, err := strconv.Atoi(fields[len(fields)-1])
			if err != nil {
				return fmt.Errorf("the server's %s line %q: %w", op, line, err)
			}
			if _, err := io.WriteString(w, line); err != nil {
				return err
			}
			if _, err := io.CopyN(w, r, int64(size)+2); err != nil {
				return err
			}
			continue
		}
		if _, err := io.WriteString(w, line); err != nil {
			return err
		}
	}
}

// infoClaiming is the INFO line of body with version in place of the
// server's own.
func infoClaiming(body, version string) (string, error) {
	// Numbers stay as the server wrote them (max_payload, client_id).
	d := json.NewDecoder(strings.NewReader(body))
	d.UseNumber()
	var info map[string]any
	if err := d.Decode(&info); err != nil {
		return "", fmt.Errorf("the server's INFO: %w", err)
	}
	info["version"] = version
	b, err := json.Marshal(info)
	if err != nil {
		return "", err
	}
	return "INFO " + string(b) + "\r\n", nil
}
