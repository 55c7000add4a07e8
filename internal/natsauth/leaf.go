package natsauth

import (
	"fmt"

	"github.com/steward-dev/steward/events"
)

// Leaf is the identity a site's leaf node links to the hub with
// (docs/design.md §7, §9): the site and the hub's JetStream domain are in
// its permissions, so the link carries that site's JetStream traffic and
// nothing of another site's or of Steward's own subjects.
func Leaf(site, hubDomain string) (Identity, error) {
	if err := (events.Site{Name: site, HubDomain: hubDomain}).Check(); err != nil {
		return Identity{}, fmt.Errorf("leaf identity: %w", err)
	}
	return Identity{Role: RoleLeaf, Site: site, HubDomain: hubDomain}, nil
}

// leafPermissions are what the link of site may carry, in nats-server's
// direction for a leaf user (2.15, leafnode.go; TestLeafIdentityCarries…
// fails with the two swapped): Publish is what the leaf may send into the
// hub (an LMSG outside it is a publish violation, and the hub closes the
// link), Subscribe is what the hub may send to the leaf (the hub drops
// the rest at delivery). Everything is named per site.
//
// Two things shape the table beyond naming (docs/design.md §7):
//   - The hub and the leaf run with nats-server's feature flag
//     js_api_reply_v2, which puts the target's domain, stream and
//     consumer in the reply subject of the server's own JetStream
//     requests. Without it they reply on $JSC.R.<id>, and a leaf allowed
//     to answer one could answer every site's.
//   - Of the site's JetStream API the hub sends only the resets of the
//     site's two consumers for it and reads. A JetStream answer reflected
//     onto a site's API subject (NATS never checks a reply subject) is
//     turned back into a request at the site: the leaf connection that
//     carries it in gives it the client information JetStream requires.
//     A direct get answers with a body its requester shaped, so anything
//     that changes a site's JetStream and crosses the link could be
//     reflected by any hub identity allowed a direct get. Setting a site
//     up and changing it is done at the site (`steward site setup
//     --site-url`); reads cross, as a reflected request gets no answer.
//
// nats-server itself lets $JS.ACK.> and service-import replies (_R_.>)
// in from any leaf whatever these say (leafMsgAllowed), and denies
// $JS.API.>, $KV.> and $OBJ.> across a link between domains.
func leafPermissions(site, hub string) Permissions {
	ev, consumer := events.StreamEvents, events.SiteConsumer(site)
	api := "$JS." + site + ".API."
	pub := []string{
		// The site's STEWARD_EVENTS sources the hub's through the hub's
		// durable consumer for the site: it resets that one consumer,
		// and confirms what it stored by flow control.
		"$JS." + hub + ".API.CONSUMER.RESET." + ev + "." + consumer,
		"$JS.FC." + ev + "." + consumer + ".*",
		// Answers to hub-side tools reading the site (SiteInboxPrefix).
		events.SiteInboxPrefix(site) + ".>",
	}
	sub := []string{
		// The site's events from the hub's consumer for it, and the
		// hub's answers to the site's reset of it.
		events.SiteDeliverSubject(site),
		"$JSC.R." + hub + ".*." + ev + "." + consumer + ".*",
		// Reads of the site's JetStream by hub-side tools.
		api + "INFO",
		api + "STREAM.INFO.*",
		api + "STREAM.NAMES",
		api + "STREAM.LIST",
		api + "CONSUMER.INFO.*.*",
		api + "CONSUMER.NAMES.*",
		api + "CONSUMER.LIST.*",
		api + "STREAM.MSG.GET.*",
		api + "DIRECT.GET.>",
	}
	for _, stream := range []string{events.StreamOutcomes, events.StreamDLQ} {
		// The hub sources the site's outcomes and dead letters through
		// the site's durable consumer of each: deliveries from the site,
		// the site's answers to the hub's reset of it, and the hub's
		// flow control back.
		pub = append(pub,
			events.SiteSourcedSubject(site, stream),
			"$JSC.R."+site+".*."+stream+"."+events.HubSourceConsumer+".*")
		sub = append(sub,
			api+"CONSUMER.RESET."+stream+"."+events.HubSourceConsumer,
			"$JS.FC."+stream+"."+events.HubSourceConsumer+".*")
	}
	return Permissions{Publish: pub, Subscribe: sub}
}
