package events

import (
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// FuzzDecode feeds arbitrary headers and payloads to the decoder: it must
// never panic, its fast path must read what sdk-go reads, and whatever it
// accepts and Validate passes must encode and decode to the same event.
func FuzzDecode(f *testing.F) {
	for _, e := range samples(f) {
		k, _ := Lookup(e.Type())
		subject, _ := k.SubjectFor(e.Subject())
		bin, _ := Encode(subject, e)
		f.Add(bin.Header.Get("ce-specversion"), bin.Header.Get("ce-type"), bin.Header.Get("ce-id"), bin.Header.Get("ce-source"), bin.Header.Get("ce-subject"), bin.Header.Get("content-type"), bin.Header.Get("ce-time"), bin.Header.Get("ce-traceparent"), bin.Data)
		st, _ := EncodeStructured(subject, e)
		f.Add("", "", "", "", "", st.Header.Get("content-type"), "", "", st.Data)
	}
	f.Fuzz(func(t *testing.T, specversion, typ, id, source, subject, contentType, tm, traceparent string, data []byte) {
		h := nats.Header{}
		for k, v := range map[string]string{"ce-specversion": specversion, "ce-type": typ, "ce-id": id, "ce-source": source, "ce-subject": subject, "content-type": contentType, "ce-time": tm, "ce-traceparent": traceparent} {
			if v != "" {
				h.Set(k, v)
			}
		}
		sameAsSDK(t, h, data)
		if isKey(subject) != keyPattern.MatchString(subject) {
			t.Fatalf("isKey(%q) is %t, KeyPattern says otherwise", subject, isKey(subject))
		}
		e, err := Decode(h, data)
		if err == nil && plainlyValid(e) && e.Validate() != nil {
			t.Fatalf("plainlyValid passed attributes sdk-go refuses: %v", e.Validate())
		}
		if err != nil || Validate(e) != nil {
			return
		}
		k, _ := Lookup(e.Type())
		subj, err := k.SubjectFor(e.Subject())
		if err != nil {
			t.Fatalf("validated event has an unusable key %q: %v", e.Subject(), err)
		}
		msg, err := Encode(subj, e)
		if err != nil {
			t.Fatalf("validated event does not encode: %v", err)
		}
		again, err := Decode(msg.Header, msg.Data)
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if again.ID() != e.ID() || again.Type() != e.Type() || string(again.Data()) != string(e.Data()) || again.Subject() != e.Subject() {
			t.Fatalf("round trip changed the event: %v vs %v", e, again)
		}
	})
}

var keyPattern = regexp.MustCompile(KeyPattern)

// sameAsSDK fails t when the fast binary-mode reading of a message differs
// from sdk-go's: an event it reads must be sdk-go's event, field for field.
func sameAsSDK(t *testing.T, h nats.Header, data []byte) {
	t.Helper()
	fast, ok := decodeBinary(h, data)
	if !ok {
		return
	}
	slow, err := decodeSDK(h, data)
	if err != nil {
		t.Fatalf("fast path read what sdk-go refuses (%v): %v %q", err, h, data)
	}
	if !reflect.DeepEqual(fast, slow) {
		t.Fatalf("fast path and sdk-go read different events from %v %q:\nfast %#v\nsdk  %#v", h, data, fast, slow)
	}
}

func TestFastDecodeReadsWhatSDKReads(t *testing.T) {
	for _, e := range samples(t) {
		k, _ := Lookup(e.Type())
		subject, _ := k.SubjectFor(e.Subject())
		msg, err := Encode(subject, e)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := decodeBinary(msg.Header, msg.Data); !ok {
			t.Fatalf("%s: the fast path does not read what Steward publishes: %v", e.Type(), msg.Header)
		}
		sameAsSDK(t, msg.Header, msg.Data)
		shouted := nats.Header{}
		for k, v := range msg.Header {
			shouted[strings.ToUpper(k)] = v
		}
		sameAsSDK(t, shouted, msg.Data)
		twice := nats.Header{"ce-id": {"a"}, "Ce-Id": {"b"}, "ce-specversion": {"1.0"}, "ce-type": {"t"}, "ce-source": {"/s"}}
		if _, ok := decodeBinary(twice, nil); ok {
			t.Fatal("the fast path read an attribute given twice")
		}
	}
}
