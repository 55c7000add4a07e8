package events

import (
	"errors"
	"fmt"
	"strings"

	"github.com/Masterminds/semver/v3"
)

// MinSiteServerVersion is the oldest nats-server a hub or a site's leaf
// node may run without losing a message across the link. Before 2.15.3 a
// durable consumer answered a reset with what it had delivered since the
// reset, not what it was reset to, and the stream sourcing through it
// counted that message as stored and skipped it when it came: the hub
// missed one site outcome for good, with its source and the site's
// consumer both reporting everything sent (a CI run of
// TestSitesConvergeThroughACut, nats-server 2.15.2, `processResetReq` and
// `trySetupSourceConsumer`; 2.15.3 answers with the reset's sequence).
const MinSiteServerVersion = "2.15.3"

// ErrSiteServerTooOld says a server on one end of a site's link runs a
// nats-server older than MinSiteServerVersion.
var ErrSiteServerTooOld = errors.New("nats-server older than " + MinSiteServerVersion)

// ServerAtLeast says whether a server version as nats-server reports it
// (2.15.3, v2.12.1-beta) is at least min. An unreadable version is given
// the benefit of the doubt, since the server itself then answers.
func ServerAtLeast(version, min string) bool {
	v, err := semver.StrictNewVersion(strings.TrimPrefix(version, "v"))
	if err != nil {
		return true
	}
	return !v.LessThan(semver.MustParse(min))
}

// CheckSiteServer returns an error wrapping ErrSiteServerTooOld when the
// server at url, the hub or site's leaf node (what), reports a version
// older than MinSiteServerVersion, so that the operator learns of the loss
// it risks from `steward site setup` and `steward status`, not from a
// missing outcome.
func CheckSiteServer(what, url, version string) error {
	if ServerAtLeast(version, MinSiteServerVersion) {
		return nil
	}
	return fmt.Errorf("%s at %s runs nats-server %s: %w, whose durable consumers answer a reset with what they delivered after it, so a stream sourcing across the link (the site's events, the hub's copy of its outcomes and dead letters) can skip a message for good after a cut; upgrade the hub and every leaf node to %s or later",
		what, url, version, ErrSiteServerTooOld, MinSiteServerVersion)
}
