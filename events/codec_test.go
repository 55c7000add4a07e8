package events

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/secure-systems-lab/go-securesystemslib/dsse"
)

// samples returns one valid event of every type, with attributes that need
// percent-encoding in headers.
func samples(t testing.TB) []event.Event {
	t.Helper()
	env := dsse.Envelope{PayloadType: PayloadTypeInvitation, Payload: "e30=", Signatures: []dsse.Signature{{KeyID: "k", Sig: "AAAA"}}}
	floor := env
	floor.PayloadType = PayloadTypeHostFloor
	membership := env
	membership.PayloadType = PayloadTypeMembership
	data := map[string]any{
		TypeReleasePublished:   ReleasePublished{Version: "1.2.3-rc.1+build.5"},
		TypeInvitationWritten:  InvitationWritten{Box: "box-7", Envelope: env},
		TypeHostFloorPublished: HostFloorPublished{Deployment: "prod", Envelope: floor},
		TypeCredentialRotated:  CredentialRotated{Hive: "hive_1", Version: 4, ClientID: "client-4", Secret: "-----BEGIN AGE ENCRYPTED FILE-----\nabc\n-----END AGE ENCRYPTED FILE-----\n"},
		TypeGrantChanged:       GrantChanged{Machine: "db-1", Requirement: "postgres", Generation: 2, Given: []Given{{From: "app", Node: "n1", Values: GivenValues{Name: "app"}, Secret: "x"}}},
		TypeSiteMembership:     SiteMembership{Site: "site-a", Envelope: membership},
	}
	var out []event.Event
	for _, k := range Kinds() {
		key, err := KeyOf(k.Type, mustJSON(t, data[k.Type]))
		if err != nil {
			t.Fatal(err)
		}
		e, err := New(k.Type, key, data[k.Type])
		if err != nil {
			t.Fatal(err)
		}
		e.SetID("01J-" + k.Type)
		e.SetSource("/console/zürich")
		e.SetExtension("comment", "über space \"quoted\" 100%")
		e.SetTime(time.Date(2026, 11, 30, 9, 0, 0, 123000000, time.UTC))
		e.SetExtension("traceparent", "00-abc-def-01")
		if err := Validate(e); err != nil {
			t.Fatalf("sample %s: %v", k.Type, err)
		}
		out = append(out, e)
	}
	return out
}

func mustJSON(t testing.TB, v any) []byte {
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func sameEvent(t *testing.T, want, got event.Event) {
	t.Helper()
	if want.ID() != got.ID() || want.Type() != got.Type() || want.Source() != got.Source() ||
		want.Subject() != got.Subject() || !want.Time().Equal(got.Time()) ||
		want.DataContentType() != got.DataContentType() || string(want.Data()) != string(got.Data()) ||
		want.Extensions()["traceparent"] != got.Extensions()["traceparent"] ||
		want.Extensions()["comment"] != got.Extensions()["comment"] {
		t.Fatalf("round trip changed the event:\nwant %v\ngot  %v", want, got)
	}
}

func TestCodecRoundTripsEveryEventInBothModes(t *testing.T) {
	for _, e := range samples(t) {
		k, _ := Lookup(e.Type())
		subject, err := k.SubjectFor(e.Subject())
		if err != nil {
			t.Fatal(err)
		}
		bin, err := Encode(subject, e)
		if err != nil {
			t.Fatal(err)
		}
		if bin.Header.Get("ce-specversion") != "1.0" || bin.Header.Get(MsgIDHeader) != e.ID() {
			t.Fatalf("binary headers: %v", bin.Header)
		}
		if got := bin.Header.Get("ce-comment"); strings.ContainsAny(got, " \"") || !strings.Contains(got, "%C3%BC") {
			t.Fatalf("ce-comment not percent-encoded: %q", got)
		}
		got, err := Decode(bin.Header, bin.Data)
		if err != nil {
			t.Fatal(err)
		}
		sameEvent(t, e, got)

		st, err := EncodeStructured(subject, e)
		if err != nil {
			t.Fatal(err)
		}
		got, err = Decode(st.Header, st.Data)
		if err != nil {
			t.Fatal(err)
		}
		sameEvent(t, e, got)
	}
}

func TestDecodeReadsHeadersCaseInsensitively(t *testing.T) {
	e := samples(t)[0]
	msg, err := Encode("steward.events.release.published", e)
	if err != nil {
		t.Fatal(err)
	}
	shouted := nats.Header{}
	for k, v := range msg.Header {
		shouted[strings.ToUpper(k)] = v
	}
	got, err := Decode(shouted, msg.Data)
	if err != nil {
		t.Fatal(err)
	}
	sameEvent(t, e, got)
}

func TestDecodeRefusesWhatIsNotACloudEvent(t *testing.T) {
	cases := map[string]nats.Header{
		"no headers":          {},
		"content type only":   {"Content-Type": {"application/json"}},
		"batch is not stored": {"content-type": {"application/cloudevents-batch+json"}},
	}
	for name, h := range cases {
		if _, err := Decode(h, []byte(`{}`)); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	if _, err := Decode(nats.Header{"content-type": {"application/cloudevents+json"}}, []byte(`{"specversion":`)); err == nil {
		t.Error("broken structured JSON decoded")
	}
}

func TestValidateRefusesMismatchedSubjectAndBadAttributes(t *testing.T) {
	e := samples(t)[1] // invitation for box-7
	e.SetSubject("box-8")
	if err := Validate(e); err == nil || !strings.Contains(err.Error(), "subject") {
		t.Fatalf("mismatched subject: %v", err)
	}
	e = samples(t)[1]
	e.SetType("dev.steward.unknown.v1")
	if err := Validate(e); err == nil || !strings.Contains(err.Error(), "not a Steward event type") {
		t.Fatalf("unknown type: %v", err)
	}
	e = samples(t)[1]
	e.SetDataContentType("text/plain")
	if err := Validate(e); err == nil || !strings.Contains(err.Error(), "datacontenttype") {
		t.Fatalf("content type: %v", err)
	}
}

func TestPercentEncodingRoundTrips(t *testing.T) {
	for _, s := range []string{"", "plain", "a b", `"q"`, "100%", "%zz", "ü€\x00\x7f", "%4"} {
		enc := percentEncode(s)
		if strings.ContainsAny(enc, " \"") {
			t.Errorf("%q encoded to %q", s, enc)
		}
		if dec := percentDecode(enc); dec != s {
			t.Errorf("%q -> %q -> %q", s, enc, dec)
		}
	}
}
