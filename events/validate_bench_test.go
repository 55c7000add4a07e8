package events

import (
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
)

// benchEvents are the events the decoding and validation benchmarks
// measure: the credential.rotated that `steward bench` publishes (what a
// handler's figure carries) and one valid event of every type.
func benchEvents(b *testing.B) map[string]*nats.Msg {
	b.Helper()
	ev, err := New(TypeCredentialRotated, "h7", CredentialRotated{
		Hive: "h7", Version: 8, ClientID: "bench",
		Secret: "-----BEGIN AGE ENCRYPTED FILE-----\nYmVuY2g=\n-----END AGE ENCRYPTED FILE-----\n",
	})
	if err != nil {
		b.Fatal(err)
	}
	ev.SetID("bench-1-7")
	ev.SetSource("/steward/bench")
	ev.SetTime(time.Date(2026, 12, 2, 9, 0, 0, 123456789, time.UTC))
	all := map[string]event.Event{"bench": ev}
	for _, e := range samples(b) {
		all[e.Type()[len("dev.steward."):]] = e
	}
	out := map[string]*nats.Msg{}
	for name, e := range all {
		k, _ := Lookup(e.Type())
		subject, err := k.SubjectFor(e.Subject())
		if err != nil {
			b.Fatal(err)
		}
		if out[name], err = Encode(subject, e); err != nil {
			b.Fatal(err)
		}
	}
	return out
}

// BenchmarkDecode is the codec alone: NATS headers and payload to an event.
func BenchmarkDecode(b *testing.B) {
	for name, msg := range benchEvents(b) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Decode(msg.Header, msg.Data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkValidate is the trust boundary alone, on a decoded event.
func BenchmarkValidate(b *testing.B) {
	for name, msg := range benchEvents(b) {
		e, err := Decode(msg.Header, msg.Data)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := Validate(e); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeValidate is what the runtime does with every message
// before a handler sees it.
func BenchmarkDecodeValidate(b *testing.B) {
	for name, msg := range benchEvents(b) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				e, err := Decode(msg.Header, msg.Data)
				if err != nil {
					b.Fatal(err)
				}
				if err := Validate(e); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
