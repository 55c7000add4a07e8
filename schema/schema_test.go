package schema

import (
	"strings"
	"testing"
)

func TestValidateNamesFieldAndRule(t *testing.T) {
	cases := []struct {
		name, typ, data string
		want            []string
	}{
		{"unknown field", "dev.steward.release.published.v1", `{"version":"1.0.0","extra":1}`, []string{"/", "extra"}},
		{"missing field", "dev.steward.credential.rotated.v1", `{"hive":"h","version":1,"clientId":"c"}`, []string{"/", "secret"}},
		{"bad key", "dev.steward.invitation.written.v1", `{"box":"../etc","envelope":{"payload":"e30=","payloadType":"application/vnd.steward.invitation.v1+json","signatures":[{"sig":"AA=="}]}}`, []string{"/box", "pattern"}},
		{"wrong type", "dev.steward.grant.changed.v1", `{"machine":"m","requirement":"postgres","generation":"1","given":[]}`, []string{"/generation", "integer"}},
		{"wrong requirement", "dev.steward.grant.changed.v1", `{"machine":"m","requirement":"mysql","generation":1,"given":[]}`, []string{"/requirement"}},
		{"membership: unknown field", "dev.steward.site.membership.v1", `{"site":"site-a","generation":1,"envelope":{"payload":"e30=","payloadType":"application/vnd.steward.sitemembership.v1+json","signatures":[{"sig":"AA=="}]}}`, []string{"/", "generation", "additional"}},
		{"membership: bad site", "dev.steward.site.membership.v1", `{"site":"site.a","envelope":{"payload":"e30=","payloadType":"application/vnd.steward.sitemembership.v1+json","signatures":[{"sig":"AA=="}]}}`, []string{"/site", "pattern"}},
		{"membership: unsigned", "dev.steward.site.membership.v1", `{"site":"site-a"}`, []string{"/", "envelope", "missing"}},
		{"membership: a grant's envelope", "dev.steward.site.membership.v1", `{"site":"site-a","envelope":{"payload":"e30=","payloadType":"application/vnd.steward.grant.v1+json","signatures":[{"sig":"AA=="}]}}`, []string{"/envelope/payloadType"}},
		{"broken json", "dev.steward.release.published.v1", `{"version":`, []string{"not valid JSON"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(tc.typ, []byte(tc.data))
			if err == nil {
				t.Fatal("want an error, got none")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestValidateAcceptsGoodData(t *testing.T) {
	good := map[string]string{
		"dev.steward.release.published.v1":  `{"version":"1.2.3-rc.1+b5","manifestDigest":"sha256:` + strings.Repeat("a", 64) + `"}`,
		"dev.steward.credential.rotated.v1": `{"hive":"hive-1","version":3,"clientId":"client","secret":"-----BEGIN AGE ENCRYPTED FILE-----\nx\n-----END AGE ENCRYPTED FILE-----\n"}`,
		"dev.steward.grant.changed.v1":      `{"machine":"db-1","requirement":"postgres","generation":2,"given":[{"from":"a","node":"n1","values":{"name":"app"},"secret":"s"}]}`,
	}
	for typ, data := range good {
		if err := Validate(typ, []byte(data)); err != nil {
			t.Errorf("%s: %v", typ, err)
		}
	}
}

func TestUnknownType(t *testing.T) {
	err := Validate("dev.steward.nope.v1", []byte(`{}`))
	if err == nil || !strings.Contains(err.Error(), "unknown event type") {
		t.Fatalf("got %v", err)
	}
}

// TestErrorsNeverQuoteSecrets is finding 12.6 as the attack: an operator
// pastes a plaintext secret where age ciphertext belongs, in a rotation and
// in each given of a grant. The refusal must name the field and the rule
// and hold no part of the value, since it is logged by the ingress and the
// worker and copied into the dead letter's reason and the termination
// advisory.
func TestErrorsNeverQuoteSecrets(t *testing.T) {
	const plain = "hunter2-plaintext-Pa55w0rd"
	cases := []struct {
		name, typ, data string
		fields          []string
	}{
		{"rotation", "dev.steward.credential.rotated.v1",
			`{"hive":"h1","version":1,"clientId":"c","secret":"` + plain + `"}`, []string{"/secret"}},
		{"grant, every given", "dev.steward.grant.changed.v1",
			`{"machine":"m1","requirement":"postgres","generation":1,"given":[` +
				`{"from":"a","node":"n","values":{"name":"app"},"secret":"` + strings.Repeat(plain, 3000) + `"},` +
				`{"from":"b","node":"n","values":{"name":"app2"},"secret":"` + plain + `","` + plain + `":1}]}`,
			[]string{"/given/0/secret", "/given/1"}},
		{"a secret where a number belongs", "dev.steward.credential.rotated.v1",
			`{"hive":"h1","version":"` + plain + `","clientId":"c","secret":"-----BEGIN AGE ENCRYPTED FILE-----"}`, []string{"/version"}},
		{"a secret in the client id", "dev.steward.credential.rotated.v1",
			`{"hive":"h1","version":1,"clientId":"` + plain + ` x","secret":"-----BEGIN AGE ENCRYPTED FILE-----"}`, []string{"/clientId", "pattern"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(tc.typ, []byte(tc.data))
			if err == nil {
				t.Fatal("want an error, got none")
			}
			msg := err.Error()
			// Any run of 6 characters of the secret is too much.
			for i := 0; i+6 <= len(plain); i++ {
				if strings.Contains(msg, plain[i:i+6]) {
					t.Fatalf("the error quotes the secret (%q): %s", plain[i:i+6], msg)
				}
			}
			for _, f := range tc.fields {
				if !strings.Contains(msg, f) {
					t.Errorf("error %q does not name %q", msg, f)
				}
			}
		})
	}
}

// TestSignedTypesTakeAnOptionalEnvelopeOfTheirOwnKind: credential.rotated
// and grant.changed validate with or without the controller's envelope
// (the workers, not the schema, refuse an unsigned one, so the runtime's
// own tests may use them as plain events), and an envelope must be of its
// type's payload kind and DSSE's shape.
func TestSignedTypesTakeAnOptionalEnvelopeOfTheirOwnKind(t *testing.T) {
	env := func(pt string) string {
		return `"envelope":{"payload":"e30=","payloadType":"` + pt + `","signatures":[{"keyid":"k","sig":"AA=="}]}`
	}
	rot := `{"hive":"hive-1","version":3,"clientId":"client","secret":"-----BEGIN AGE ENCRYPTED FILE-----\nx\n-----END AGE ENCRYPTED FILE-----\n",`
	grant := `{"machine":"db-1","requirement":"postgres","generation":2,"given":[],`
	for name, c := range map[string]struct {
		typ, data string
		ok        bool
	}{
		"signed rotation":          {"dev.steward.credential.rotated.v1", rot + env("application/vnd.steward.rotation.v1+json") + `}`, true},
		"signed grant":             {"dev.steward.grant.changed.v1", grant + env("application/vnd.steward.grant.v1+json") + `}`, true},
		"rotation with a grant's":  {"dev.steward.credential.rotated.v1", rot + env("application/vnd.steward.grant.v1+json") + `}`, false},
		"grant with an invitation": {"dev.steward.grant.changed.v1", grant + env("application/vnd.steward.invitation.v1+json") + `}`, false},
		"no signatures":            {"dev.steward.grant.changed.v1", grant + `"envelope":{"payload":"e30=","payloadType":"application/vnd.steward.grant.v1+json","signatures":[]}}`, false},
		"extra envelope field":     {"dev.steward.credential.rotated.v1", rot + `"envelope":{"payload":"e30=","payloadType":"application/vnd.steward.rotation.v1+json","signatures":[{"sig":"AA=="}],"x":1}}`, false},
	} {
		err := Validate(c.typ, []byte(c.data))
		if (err == nil) != c.ok {
			t.Errorf("%s: %v, want ok=%t", name, err, c.ok)
		}
	}
}
