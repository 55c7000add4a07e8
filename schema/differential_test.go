package schema

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// agree fails t when the generated validator and the oracle disagree on
// data: one accepts what the other refuses, or they name different
// problems (field or rule).
func agree(t *testing.T, typ string, data []byte) {
	t.Helper()
	got, want := Validate(typ, data), oracle(t, typ, data)
	if (got == nil) != (want == nil) {
		t.Fatalf("%s %q:\ngenerated: %v\noracle:    %v", typ, data, got, want)
	}
	if got == nil {
		sameFields(t, typ, data)
		return
	}
	var g, w *Error
	if !errors.As(got, &g) || !errors.As(want, &w) {
		t.Fatalf("%s %q: not schema errors:\ngenerated: %v\noracle:    %v", typ, data, got, want)
	}
	if !slices.Equal(g.Problems, w.Problems) {
		t.Fatalf("%s %q: different problems:\ngenerated: %q\noracle:    %q", typ, data, g.Problems, w.Problems)
	}
}

// differentialSeeds are data the two must agree on, chosen where a
// hand-written parser goes wrong: duplicate names, escapes, numbers that
// are integers by value, depth, bad UTF-8, what follows the value.
var differentialSeeds = []struct {
	typ  string
	data string
}{
	{"release.published", `{"version":"1.2.3-rc.1+b5","manifestDigest":"sha256:` + strings.Repeat("a", 64) + `"}`},
	{"release.published", `{"version":"1.0.0","extra":1,"Zed":2,"a b":3,"extra":4}`},
	{"release.published", `{"version":"01.0.0"}`},
	{"release.published", `{"version":"bad","version":"1.0.0"}`},
	{"release.published", `{"version":"1.0.0","version":"bad"}`},
	{"release.published", `{"version":"1.0.0","version":7}`},
	{"release.published", `{"vers\u0069on":"1.0.0"}`},
	{"release.published", `{"version":"1.0.0"} `},
	{"release.published", `{"version":"1.0.0"} x`},
	{"release.published", `{"version":"1.0.0"}{}`},
	{"release.published", ` [] `},
	{"release.published", `"1.0.0"`},
	{"release.published", `12`},
	{"release.published", `tru`},
	{"release.published", ``},
	{"release.published", `{"version":"1.0.0","x":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}`},
	{"release.published", `{"version":"1.0.0","x":` + strings.Repeat("[", 9998) + strings.Repeat("]", 9998) + `}`},
	{"release.published", `{"version":"1.0.0","x":` + strings.Repeat("[", 9999) + strings.Repeat("]", 9999) + `}`},
	{"release.published", `{"version":"1.0.0\ud800"}`},
	{"release.published", `{"version":"1.0.0-\ud83d\ude00"}`},
	{"release.published", "{\"version\":\"1.0.0-\xff\"}"},
	{"release.published", "{\"version\":\"1.0.0\x01\"}"},
	{"release.published", `{"version":"1.0.0\x"}`},
	{"credential.rotated", `{"hive":"hive-1","version":3,"clientId":"client","secret":"-----BEGIN AGE ENCRYPTED FILE-----\nx\n-----END AGE ENCRYPTED FILE-----\n"}`},
	{"credential.rotated", `{"hive":"h","version":1.0,"clientId":"c","secret":"-----BEGIN AGE ENCRYPTED FILE-----"}`},
	{"credential.rotated", `{"hive":"h","version":1e3,"clientId":"c","secret":"-----BEGIN AGE ENCRYPTED FILE-----"}`},
	{"credential.rotated", `{"hive":"h","version":10E-1,"clientId":"c","secret":"-----BEGIN AGE ENCRYPTED FILE-----"}`},
	{"credential.rotated", `{"hive":"h","version":1.5,"clientId":"c","secret":"-----BEGIN AGE ENCRYPTED FILE-----"}`},
	{"credential.rotated", `{"hive":"h","version":-0,"clientId":"c","secret":"-----BEGIN AGE ENCRYPTED FILE-----"}`},
	{"credential.rotated", `{"hive":"h","version":0.5e1,"clientId":"c","secret":"-----BEGIN AGE ENCRYPTED FILE-----"}`},
	{"credential.rotated", `{"hive":"h","version":1e1000001,"clientId":"c","secret":"-----BEGIN AGE ENCRYPTED FILE-----"}`},
	{"credential.rotated", `{"hive":"h","version":99999999999999999999999,"clientId":"c","secret":"-----BEGIN AGE ENCRYPTED FILE-----"}`},
	{"credential.rotated", `{"hive":"h","version":-99999999999999999999999,"clientId":"","secret":""}`},
	{"credential.rotated", `{"hive":"h","version":01,"clientId":"c","secret":"x"}`},
	{"credential.rotated", `{"hive":"h","version":1.,"clientId":"c","secret":"x"}`},
	{"credential.rotated", `{"hive":null,"version":true,"clientId":[],"secret":{}}`},
	{"credential.rotated", `{"hive":"h1","version":1,"clientId":"c","secret":"-----BEGIN AGE ENCRYPTED FILE-----","envelope":{"payload":"","payloadType":"x","signatures":[{"sig":"","keyid":5,"k":1},{}]}}`},
	{"credential.rotated", `{}`},
	{"grant.changed", `{"machine":"db-1","requirement":"postgres","generation":2,"given":[{"from":"a","node":"n1","values":{"name":"app"},"secret":"s"}]}`},
	{"grant.changed", `{"machine":"m","requirement":"mysql","generation":1,"given":[{"from":"","node":"n","values":{"nom":"x"},"secret":1},3,{"from":"a","node":"n","values":{"name":"x"},"secret":"s","extra":1}]}`},
	{"grant.changed", `{"machine":"m","requirement":5,"generation":"1","given":{}}`},
	{"grant.changed", `{"machine":"m","requirement":"post\u0067res","generation":1,"given":[]}`},
	{"grant.changed", `{"machine":"m","requirement":"postgres","generation":1,"given":[],"envelope":{"payload":"e30=","payloadType":"application/vnd.steward.grant.v1+json","signatures":[{"sig":"AA=="},{"sig":"AA=="},{"sig":"AA=="},{"sig":"AA=="},{"sig":"AA=="},{"sig":"AA=="},{"sig":"AA=="},{"sig":"AA=="},{"sig":"AA=="}]}}`},
	{"grant.changed", `{"machine":"m","requirement":"postgres","generation":1,"given":[` + strings.TrimSuffix(strings.Repeat(`{"from":"a","node":"n","values":{"name":"x"},"secret":""},`, 1001), ",") + `]}`},
	{"invitation.written", `{"box":"../etc","envelope":{"payload":"e30=","payloadType":"application/vnd.steward.invitation.v1+json","signatures":[{"sig":"AA=="}]}}`},
	{"invitation.written", `{"box":"b","envelope":{"payload":"e30=","payloadType":"application/vnd.steward.invitation.v1+json","signatures":[{"sig":"AA=="}]},"envelope":{}}`},
	{"hostfloor.published", `{"deployment":"prod","envelope":{"payload":"e30=","payloadType":"application/vnd.steward.hostfloor.v1+json","signatures":[{"keyid":"k","sig":"AA=="}]}}`},
	{"hostfloor.published", `{"deployment":"` + strings.Repeat("a", 64) + `","envelope":null}`},
	{"site.membership", `{"site":"site-a","envelope":{"payload":"e30=","payloadType":"application/vnd.steward.sitemembership.v1+json","signatures":[{"keyid":"k","sig":"AA=="}]}}`},
	{"site.membership", `{"site":"site.a","envelope":{"payload":"","payloadType":"application/vnd.steward.grant.v1+json","signatures":[]},"generation":1}`},
	{"site.membership", `{"site":"site-a"}`},
	{"site.membership", `{"site":"site-a","envelope":{"payload":"e30=","payloadType":"application/vnd.steward.sitemembership.v1+json","signatures":[{"sig":"AA==","x":1}],"y":2},"site":"*"}`},
}

func TestGeneratedValidatorsAgreeWithTheOracle(t *testing.T) {
	for _, c := range differentialSeeds {
		agree(t, typePrefix+c.typ+".v1", []byte(c.data))
	}
}

// FuzzValidateAgreesWithOracle is the differential test: the generated
// validators and the JSON Schema library judge the same data, and any
// difference in verdict, field or rule fails it.
func FuzzValidateAgreesWithOracle(f *testing.F) {
	types := Types()
	for _, c := range differentialSeeds {
		if len(c.data) < 4096 {
			f.Add(uint8(slices.Index(types, typePrefix+c.typ+".v1")), []byte(c.data))
		}
	}
	f.Fuzz(func(t *testing.T, typ uint8, data []byte) {
		agree(t, types[int(typ)%len(types)], data)
	})
}

// sameFields fails t when a top-level string field that ValidateKey reads
// from valid data is not the one encoding/json decodes (the last of
// duplicate names, escapes resolved).
func sameFields(t *testing.T, typ string, data []byte) {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s %q: valid data does not decode: %v", typ, data, err)
	}
	fields, _ := doc.(map[string]any)
	for k, v := range fields {
		want, _ := v.(string)
		got, err := ValidateKey(typ, data, k)
		if err != nil || got != want {
			t.Fatalf("%s %q: field %q read as %q (%v), encoding/json reads %q", typ, data, k, got, err, want)
		}
	}
}

// BenchmarkRepeatedHugeExponents: math/big takes some 24 ms over
// 1e999999, and a name may be repeated thousands of times in 256 KiB; the
// validator must not do that arithmetic once per repetition.
func BenchmarkRepeatedHugeExponents(b *testing.B) {
	data := []byte(`{"hive":"h","clientId":"c","secret":"-----BEGIN AGE ENCRYPTED FILE-----"` + strings.Repeat(`,"version":1e999999`, 10000) + `}`)
	b.ReportAllocs()
	for b.Loop() {
		if Validate("dev.steward.credential.rotated.v1", data) != nil {
			b.Fatal("refused")
		}
	}
}

// BenchmarkManyUnknownNames: a closed object refusing tens of thousands
// of distinct names must not compare each with every other.
func BenchmarkManyUnknownNames(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"version":"1.0.0"`)
	for i := range 20000 {
		fmt.Fprintf(&sb, `,"n%d":0`, i)
	}
	sb.WriteString("}")
	data := []byte(sb.String())
	b.ReportAllocs()
	for b.Loop() {
		if Validate("dev.steward.release.published.v1", data) == nil {
			b.Fatal("accepted")
		}
	}
}
