// Package leafnode writes the nats-server configuration of a site's leaf
// node (docs/design.md §9): what `steward site config` prints and what
// `steward bench fleet --sites` runs its sites from, so the bench measures
// the leaf an operator deploys.
package leafnode

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"github.com/steward-dev/steward/events"
)

// Config is what a leaf node's configuration is written from. The errors
// of Check name `steward site config`'s flags, which set these fields.
type Config struct {
	// Site is the site's name: its JetStream domain and its server name.
	Site string
	// HubURL is the hub's leaf node port, nats-leaf://HOST:7422 (or tls://).
	HubURL string
	// LeafCreds is the credentials file the leaf connects to the hub with;
	// empty on an open bus.
	LeafCreds string
	// Listen is where the site's workers connect; HTTPListen the
	// monitoring address, empty for none.
	Listen, HTTPListen string
	// Store is the leaf node's JetStream store, its own.
	Store string
	// ServerDir and Account put the leaf in JWT mode: the operator and
	// account JWTs `steward creds init --server-dir` writes, and the
	// account the link binds locally.
	ServerDir, Account string
	// MaxFileStore is the store's size, as nats-server reads it (32GB);
	// empty leaves the server's default.
	MaxFileStore string
}

// Check refuses a configuration nats-server would not run as a site's
// leaf node, naming the flag that sets the field.
func (c Config) Check() error {
	if err := events.CheckDomain(c.Site); err != nil {
		return fmt.Errorf("site name: %w", err)
	}
	if !strings.HasPrefix(c.HubURL, "nats-leaf://") && !strings.HasPrefix(c.HubURL, "tls://") && !strings.HasPrefix(c.HubURL, "nats://") {
		return fmt.Errorf("--hub-url %q: want the hub's leaf node port, nats-leaf://HOST:7422 (or tls://)", c.HubURL)
	}
	if c.Store == "" {
		return fmt.Errorf("--store-dir is empty: each leaf node needs a store of its own")
	}
	if (c.ServerDir == "") != (c.Account == "") {
		return fmt.Errorf("--server-dir and --account go together: the leaf trusts the operator in --server-dir and binds the link to --account (account.pub)")
	}
	if c.ServerDir != "" && c.LeafCreds == "" {
		return fmt.Errorf("--leaf-creds is empty: on the closed bus the hub accepts the link only with the site's leaf identity (steward creds issue leaf %s)", c.Site)
	}
	return nil
}

// ReconnectDelay is how long a leaf node waits before it tries a cut link
// again, plus nats-server's jitter of up to as much: the time from a heal
// to the site's first sourced event. nats-server's default, 1s, made a
// heal take 1-2s before catching up began; a try every quarter second
// costs the hub one refused connection a try while it is unreachable.
const ReconnectDelay = "250ms"

// ReplyV2Flag is nats-server's feature flag scoping the reply subjects of
// the server's own JetStream requests, which the leaf identity's
// permissions rely on (internal/natsauth); the hub needs it too.
const ReplyV2Flag = "js_api_reply_v2"

// Render is the configuration file. Strings are quoted with strconv.Quote,
// which nats-server's parser reads as JSON strings.
func (c Config) Render() []byte {
	var b bytes.Buffer
	q := strconv.Quote
	fmt.Fprintf(&b, "# NATS leaf node of Steward site %s (written by steward site config).\n", c.Site)
	fmt.Fprintf(&b, "# A persistent server name and a store of its own (nats-server issue 3024).\n")
	fmt.Fprintf(&b, "server_name: %s\n", q("steward-site-"+c.Site))
	fmt.Fprintf(&b, "listen: %s\n", q(c.Listen))
	if c.HTTPListen != "" {
		fmt.Fprintf(&b, "http: %s\n", q(c.HTTPListen))
	}
	fmt.Fprintf(&b, "max_payload: 1MB\n")
	fmt.Fprintf(&b, "\n# The replies of the server's own JetStream requests name their target's\n# domain, stream and consumer (nats-server 2.15), so the leaf identity's\n# permissions (steward creds issue leaf %s) carry this site's alone. The hub\n# runs with it too.\n", c.Site)
	fmt.Fprintf(&b, "feature_flags: {\n  %s: true\n}\n", ReplyV2Flag)
	if c.ServerDir != "" {
		fmt.Fprintf(&b, "\n# The bus is closed at the site too: the hub's operator, its accounts'\n# JWTs from steward creds init --server-dir, so every identity's credentials\n# work here unchanged.\n")
		fmt.Fprintf(&b, "operator: %s\n", q(c.ServerDir+"/operator.jwt"))
		fmt.Fprintf(&b, "resolver: {\n  type: full\n  dir: %s\n  allow_delete: false\n}\n", q(c.ServerDir+"/accounts"))
	}
	fmt.Fprintf(&b, "\n# The site's own JetStream: its domain is the site's name, so workers here\n# use it (--js-domain %s) and the hub reaches it as $JS.%s.API.\n", c.Site, c.Site)
	fmt.Fprintf(&b, "jetstream {\n  domain: %s\n  store_dir: %s\n  sync_interval: always\n", q(c.Site), q(c.Store))
	if c.MaxFileStore != "" {
		fmt.Fprintf(&b, "  max_file_store: %s\n", c.MaxFileStore)
	}
	fmt.Fprintf(&b, "}\n")
	fmt.Fprintf(&b, "\n# The link to the hub carries JetStream's subjects only: events, outcomes and\n# dead letters cross as sourcing, stored and acknowledged by one stream;\n# stored notices and control messages stay on their side. A cut link is tried\n# again every 250-500ms (the delay and a jitter of up to as much), so a site\n# starts catching up within half a second of the heal.\n")
	fmt.Fprintf(&b, "leafnodes {\n  reconnect: %s\n  remotes: [\n    {\n      urls: [%s]\n", ReconnectDelay, q(c.HubURL))
	// The hub advertises its servers' own leaf addresses; a site that
	// reaches it through a proxy, a NAT or a tunnel would reconnect around
	// it. Only the addresses the operator gave are used.
	fmt.Fprintf(&b, "      ignore_discovered_servers: true\n")
	if c.LeafCreds != "" {
		fmt.Fprintf(&b, "      credentials: %s\n", q(c.LeafCreds))
	}
	if c.Account != "" {
		fmt.Fprintf(&b, "      account: %s\n", q(c.Account))
	}
	var deny []string
	for _, s := range events.SiteLinkDenied() {
		deny = append(deny, q(s))
	}
	fmt.Fprintf(&b, "      deny_imports: [%s]\n      deny_exports: [%s]\n    }\n  ]\n}\n", strings.Join(deny, ", "), strings.Join(deny, ", "))
	return b.Bytes()
}
