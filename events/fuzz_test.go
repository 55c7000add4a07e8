package events

import (
	"testing"

	"github.com/nats-io/nats.go"
)

// FuzzDecode feeds arbitrary headers and payloads to the decoder: it must
// never panic, and whatever it accepts and Validate passes must encode and
// decode to the same event.
func FuzzDecode(f *testing.F) {
	for _, e := range samples(f) {
		k, _ := Lookup(e.Type())
		subject, _ := k.SubjectFor(e.Subject())
		bin, _ := Encode(subject, e)
		f.Add(bin.Header.Get("ce-specversion"), bin.Header.Get("ce-type"), bin.Header.Get("ce-id"), bin.Header.Get("ce-source"), bin.Header.Get("ce-subject"), bin.Header.Get("content-type"), bin.Data)
		st, _ := EncodeStructured(subject, e)
		f.Add("", "", "", "", "", st.Header.Get("content-type"), st.Data)
	}
	f.Fuzz(func(t *testing.T, specversion, typ, id, source, subject, contentType string, data []byte) {
		h := nats.Header{}
		for k, v := range map[string]string{"ce-specversion": specversion, "ce-type": typ, "ce-id": id, "ce-source": source, "ce-subject": subject, "content-type": contentType} {
			if v != "" {
				h.Set(k, v)
			}
		}
		e, err := Decode(h, data)
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
