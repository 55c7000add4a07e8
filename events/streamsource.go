package events

import (
	"crypto/sha256"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A message's proof binds the JetStream domain it was written in
// (docs/design.md §7). The hub's STEWARD_OUTCOMES and STEWARD_DLQ source
// each site's (§9), so what a site's worker wrote there is signed for the
// site's domain: a hub-side reader verifies a sourced message under the
// domain of the source it came through. nats-server writes that source in
// the Nats-Stream-Source header of every message a stream sources (and
// 2.15 refuses to store a message published with one); a reader believes
// it only for the sources the stream is configured with, read from the
// server, so a header naming any other domain gains nothing, and a
// message that reached the stream otherwise is verified in its own.

// StreamSourceHeader is the header nats-server puts on a sourced message:
// "<source> <sequence> <filter> <transform> <subject> [<ident>]", where
// <source> is the name the stream gives that source (sourceName).
const StreamSourceHeader = "Nats-Stream-Source"

// SourceDomains are the JetStream domains a stream sources from, by the
// name nats-server gives each of its sources in the Nats-Stream-Source
// header.
type SourceDomains map[string]string

// SourceDomainsOf reads the sources cfg is configured with in other
// domains: those whose external API prefix is $JS.<domain>.API, as
// HubSiteSource makes them and as nats.go writes a source's Domain.
func SourceDomainsOf(cfg jetstream.StreamConfig) SourceDomains {
	out := SourceDomains{}
	for _, src := range cfg.Sources {
		if src == nil || src.External == nil {
			continue
		}
		if domain, ok := apiPrefixDomain(src.External.APIPrefix); ok {
			out[sourceName(src)] = domain
		}
	}
	return out
}

// apiPrefixDomain is the domain of a JetStream API prefix $JS.<domain>.API.
func apiPrefixDomain(prefix string) (string, bool) {
	domain, ok := strings.CutPrefix(prefix, "$JS.")
	if !ok {
		return "", false
	}
	domain, ok = strings.CutSuffix(domain, ".API")
	return domain, ok && CheckDomain(domain) == nil
}

// sourceName is the name nats-server gives a stream's source, the first
// field of its Nats-Stream-Source header (StreamSource.composeIName in its
// stream.go): the source stream's name, then ":" and the hash of its
// external API prefix when it has one, then ":C=" and the hash of its
// consumer's name when it is sourced through one.
func sourceName(src *jetstream.StreamSource) string {
	name := src.Name
	if src.External != nil {
		name += ":" + serverHash(src.External.APIPrefix)
	}
	if src.Consumer != nil {
		name += ":C=" + serverHash(src.Consumer.Name)
	}
	return name
}

// serverHash is the hash nats-server names things by (getHash in its
// events.go): the first eight bytes of the SHA-256 of s, each taken
// modulo 62 as a digit of 0-9, A-Z, a-z.
func serverHash(s string) string {
	const digits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	sum := sha256.Sum256([]byte(s))
	out := make([]byte, 8)
	for i := range out {
		out[i] = digits[int(sum[i])%len(digits)]
	}
	return string(out)
}

// ProofDomain is the domain the proof of a message stored on subject, with
// headers h, in a stream whose sources are d, must bind: the domain of the
// source it was sourced from, or local (the stream's own) for anything
// else. A message counts as sourced only when it carries exactly one
// Nats-Stream-Source header naming one of d's sources and its own subject
// (the sites' sources transform no subject), and none of the headers a
// direct get's answer carries: an answer reflected onto the subject keeps
// the headers of the message it answered with, a sourced one's included,
// and is never taken for what the source sent.
func (d SourceDomains) ProofDomain(local, subject string, h nats.Header) string {
	if len(d) == 0 {
		return local
	}
	var values []string
	for k, vs := range h {
		lk := strings.ToLower(k)
		switch lk {
		case "nats-stream", "nats-subject", "nats-sequence", "nats-time-stamp":
			return local
		case strings.ToLower(StreamSourceHeader):
			values = append(values, vs...)
		}
	}
	if len(values) != 1 {
		return local
	}
	fields := strings.Split(values[0], " ")
	if len(fields) < 5 || fields[4] != subject {
		return local
	}
	if domain, ok := d[fields[0]]; ok {
		return domain
	}
	return local
}
