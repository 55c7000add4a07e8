package signing

import (
	"errors"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/strictjson"
)

// TestMembershipPayloadRefusals is the signed payload's schema as attacks
// signed with the controller key itself (a controller bug, or a record
// written by hand): an unknown field, a key that is no subject token, a
// key twice, no generation, another site, another version. Each is
// refused naming the field and the rule, so nothing of it reaches a
// subject filter.
func TestMembershipPayloadRefusals(t *testing.T) {
	privPath, pubPath := keyPair(t, Ed25519)
	priv, _ := LoadPrivateKey(privPath)
	keys, err := LoadEnvelopeKeys(pubPath)
	if err != nil {
		t.Fatal(err)
	}
	good := `{"v":1,"site":"site-a","generation":4,"boxes":[],"hives":["hive-1"],"machines":["db-1"],"issuedAt":"2026-01-02T03:04:05Z"}`
	open := func(payload string) (events.Membership, error) {
		env, err := SignEnvelope(priv, events.PayloadTypeMembership, []byte(payload))
		if err != nil {
			t.Fatal(err)
		}
		return OpenMembership(keys, events.SiteMembership{Site: "site-a", Envelope: env})
	}
	if m, err := open(good); err != nil || m.Generation != 4 || len(m.Hives) != 1 {
		t.Fatalf("the good payload: %+v %v", m, err)
	}
	for name, c := range map[string]struct {
		payload string
		rule    string
		names   []string
	}{
		"unknown field":      {strings.Replace(good, `"v":1,`, `"v":1,"extra":true,`, 1), RulePayload, []string{"extra"}},
		"miscased field":     {strings.Replace(good, `"hives"`, `"Hives"`, 1), RulePayload, []string{"Hives"}},
		"missing generation": {strings.Replace(good, `"generation":4,`, ``, 1), RulePayload, []string{"/generation", "minimum 1"}},
		"generation 0":       {strings.Replace(good, `"generation":4`, `"generation":0`, 1), RulePayload, []string{"/generation", "minimum 1"}},
		"negative":           {strings.Replace(good, `"generation":4`, `"generation":-1`, 1), RulePayload, []string{"generation"}},
		"bad hive key":       {strings.Replace(good, `"hive-1"`, `"hive.>"`, 1), RulePayload, []string{"/hives/0", "pattern"}},
		"bad machine key":    {strings.Replace(good, `"db-1"`, `"../db"`, 1), RulePayload, []string{"/machines/0", "pattern"}},
		"a key twice":        {strings.Replace(good, `["hive-1"]`, `["hive-1","hive-1"]`, 1), RulePayload, []string{"/hives/1", "uniqueItems"}},
		"another site":       {strings.Replace(good, `"site-a"`, `"site-b"`, 1), RuleBinding, []string{"site-b", "site-a"}},
		"version 2":          {strings.Replace(good, `"v":1`, `"v":2`, 1), RulePayload, []string{"/v", "const"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := open(c.payload)
			var se *StateError
			if !errors.As(err, &se) || se.Rule != c.rule {
				t.Fatalf("got %v, want a refusal by rule %s", err, c.rule)
			}
			for _, n := range c.names {
				if !strings.Contains(err.Error(), n) {
					t.Errorf("%q does not name %q", err, n)
				}
			}
		})
	}
}

// TestMembershipIsBelievedOnlyFromTheController: the same payload signed
// by another key, or carried with no signature, is refused by rule.
func TestMembershipIsBelievedOnlyFromTheController(t *testing.T) {
	_, pubPath := keyPair(t, Ed25519)
	evilPath, _ := keyPair(t, Ed25519)
	keys, err := LoadEnvelopeKeys(pubPath)
	if err != nil {
		t.Fatal(err)
	}
	evil, _ := LoadPrivateKey(evilPath)
	m := events.Membership{V: 1, Site: "site-a", Generation: 9, Boxes: []string{}, Hives: []string{"hive-1"}, Machines: []string{}}
	forged, err := SignMembership(evil, m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenMembership(keys, forged); !errors.Is(err, ErrBadSignature) {
		t.Errorf("signed by another key: %v, want %v", err, ErrBadSignature)
	}
	var se *StateError
	if _, err := OpenMembership(keys, events.SiteMembership{Site: "site-a"}); !errors.As(err, &se) || se.Rule != RuleUnsigned {
		t.Errorf("no envelope: %v, want rule %s", err, RuleUnsigned)
	}
}

// TestSignEventSignsAMembershipRecord: the operator's record becomes
// {site, envelope}, valid against the event's schema, and a record that
// is not one (an unknown field, a key not its site's, a bad key) is
// refused before anything is signed.
func TestSignEventSignsAMembershipRecord(t *testing.T) {
	privPath, pubPath := keyPair(t, Ed25519)
	priv, _ := LoadPrivateKey(privPath)
	keys, err := LoadEnvelopeKeys(pubPath)
	if err != nil {
		t.Fatal(err)
	}
	record := func(key, data string) event.Event {
		e := event.New()
		e.SetID("id-1")
		e.SetSource("/test")
		e.SetType(events.TypeSiteMembership)
		e.SetSubject(key)
		if err := e.SetData(events.ContentTypeJSON, []byte(data)); err != nil {
			t.Fatal(err)
		}
		return e
	}
	signed, err := SignEvent(priv, record("site-a", `{"site":"site-a","generation":2,"hives":["hive-1"],"machines":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := events.Validate(signed); err != nil {
		t.Fatalf("the signed membership is not a valid event: %v", err)
	}
	var data events.SiteMembership
	if err := strictjson.Decode(signed.Data(), &data); err != nil {
		t.Fatal(err)
	}
	m, err := OpenMembership(keys, data)
	if err != nil || m.Generation != 2 || m.Boxes == nil || len(m.Hives) != 1 || m.IssuedAt == "" {
		t.Fatalf("the signed membership opens as %+v, %v", m, err)
	}
	for name, c := range map[string]struct{ key, data, want string }{
		"unknown field":  {"site-a", `{"site":"site-a","generation":2,"hives":[],"owner":"x"}`, "owner"},
		"key not site":   {"site-b", `{"site":"site-a","generation":2}`, "not its key"},
		"bad key":        {"site-a", `{"site":"site-a","generation":2,"boxes":["a b"]}`, "/boxes/0"},
		"no generation":  {"site-a", `{"site":"site-a","hives":["h"]}`, "/generation"},
		"envelope given": {"site-a", `{"site":"site-a","generation":2,"envelope":{}}`, "envelope"},
	} {
		if _, err := SignEvent(priv, record(c.key, c.data)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want a refusal naming %q", name, err, c.want)
		}
	}
}
