package events

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

func sampleOriginal(t testing.TB) (string, nats.Header, []byte) {
	t.Helper()
	e := samples(t)[0]
	k, _ := Lookup(e.Type())
	subject, _ := k.SubjectFor(e.Subject())
	msg, err := Encode(subject, e)
	if err != nil {
		t.Fatal(err)
	}
	return subject, msg.Header, msg.Data
}

// TestDeadLetterKeepsNoPublisherControlHeaders: what a publisher can set on
// its event besides the CloudEvent (JetStream's expectations and rollups,
// a forged Steward-* header in any case) is not in the letter.
func TestDeadLetterKeepsNoPublisherControlHeaders(t *testing.T) {
	subject, h, data := sampleOriginal(t)
	h.Set("Nats-Expected-Last-Sequence", "7")
	h["nats-rollup"] = []string{"all"}
	h["steward-subject"] = []string{"$JS.API.STREAM.PURGE.STEWARD_EVENTS"}
	h["Steward-Worker"] = []string{"converge-prod"}
	msg, digest := NewDeadLetter(LetterSource{Consumer: "rt-a", DLQSubject: DLQSubject("rt", "a"), Stream: StreamEvents, Sequence: 9, Subject: subject, Reason: "r", Header: h, Data: data})
	for k := range msg.Header {
		if lk := strings.ToLower(k); (strings.HasPrefix(lk, "nats-") && k != nats.MsgIdHdr) || lk == "steward-subject" && k != HeaderSubject {
			t.Errorf("letter keeps %s", k)
		}
	}
	d := ParseDeadLetter(1, msg.Subject, msg.Header, msg.Data)
	if d.Worker != "rt-a" || d.Subject != subject || d.Digest != digest || d.Event == nil || d.Verify() != nil || d.CheckWorker() != nil {
		t.Fatalf("letter read back as %+v (verify %v)", d, d.Verify())
	}
	if id := msg.Header.Get(nats.MsgIdHdr); !strings.Contains(id, strings.TrimPrefix(digest, "sha256:")[:32]) {
		t.Fatalf("letter id %q does not carry the digest", id)
	}
}

// TestDeadLetterCheckWorker: a letter whose worker header names another
// worker than its DLQ subject was not written by that worker.
func TestDeadLetterCheckWorker(t *testing.T) {
	for _, tc := range []struct {
		subject, worker string
		ok              bool
	}{
		{"steward.dlq.credential.h1", "credential-h1", true},
		{"steward.dlq.credential.h1", "provision-h1", false},
		{"steward.dlq.credential.h1.x", "credential-h1.x", false},
		{"steward.dlq.credential", "credential", false},
		{"$JS.API.STREAM.PURGE.STEWARD_EVENTS", "credential-h1", false},
	} {
		d := DeadLetter{DLQSubject: tc.subject, Worker: tc.worker}
		if err := d.CheckWorker(); (err == nil) != tc.ok {
			t.Errorf("%s / %s: %v", tc.subject, tc.worker, err)
		}
	}
}

// TestDeadLetterTamperedFailsVerify: changing the data or an attribute of
// a letter breaks its digest.
func TestDeadLetterTamperedFailsVerify(t *testing.T) {
	subject, h, data := sampleOriginal(t)
	msg, _ := NewDeadLetter(LetterSource{Consumer: "rt-a", DLQSubject: DLQSubject("rt", "a"), Stream: StreamEvents, Sequence: 9, Subject: subject, Header: h, Data: data})
	msg.Header.Set("ce-subject", "other")
	if err := ParseDeadLetter(1, msg.Subject, msg.Header, msg.Data).Verify(); err == nil || errors.Is(err, ErrLetterUnverifiable) {
		t.Fatalf("tampered letter: %v", err)
	}
}

// FuzzParseDeadLetter feeds arbitrary letters to the one parser of the
// dead-letter format (it must never panic, whatever a forger wrote), and
// arbitrary originals to the writer: the letter must fit its size limit,
// keep no JetStream or forged Steward-* header, and read back to the same
// worker, original and digest, verifiable whole or by reference.
func FuzzParseDeadLetter(f *testing.F) {
	subject, h, data := sampleOriginal(f)
	f.Add(subject, "ce-id", "x", "Steward-Truncated", "12", "reason", uint64(3), data, uint32(1<<20))
	f.Add("steward.dlq.a.b", "Nats-Expected-Stream", "S", "steward-subject", "$JS.API.X", "", uint64(0), []byte("{}"), uint32(0))
	f.Add(subject, "ce-data", strings.Repeat("a", 5000), "CE-ID", "\x1b]52;c;aGk=\x07", "r", uint64(1<<40), []byte(strings.Repeat("b", 40000)), uint32(20000))
	f.Fuzz(func(t *testing.T, subject, k1, v1, k2, v2, reason string, seq uint64, data []byte, limit uint32) {
		orig := nats.Header{}
		for k, v := range h {
			orig[k] = append([]string(nil), v...)
		}
		orig[k1] = append(orig[k1], v1)
		orig[k2] = append(orig[k2], v2)

		// Whatever sits in the DLQ parses without panicking.
		d := ParseDeadLetter(seq, subject, orig, data)
		_, _, _ = d.Verify(), d.CheckWorker(), d.EventID()

		maxBytes := 16<<10 + int(limit%(2<<20))
		reason = reason[:min(len(reason), 2000)]
		msg, digest := NewDeadLetter(LetterSource{Consumer: "rt-f", DLQSubject: DLQSubject("rt", "f"), Stream: StreamEvents,
			Sequence: seq, Subject: subject, Delivered: 2, Reason: reason, Header: orig, Data: data, MaxBytes: maxBytes})
		if size := headerBytes(msg.Header) + len(msg.Data); size > maxBytes {
			t.Fatalf("letter of %d bytes over the limit %d", size, maxBytes)
		}
		for k := range msg.Header {
			lk := strings.ToLower(k)
			if strings.HasPrefix(lk, "nats-") && k != nats.MsgIdHdr {
				t.Fatalf("letter keeps %s", k)
			}
			if strings.HasPrefix(lk, "steward-") && !strings.HasPrefix(k, "Steward-") {
				t.Fatalf("letter keeps the publisher's %s", k)
			}
		}
		back := ParseDeadLetter(1, msg.Subject, msg.Header, msg.Data)
		if back.Worker != "rt-f" || back.Sequence != seq || back.Subject != subject || back.Digest != digest || back.Stream != StreamEvents || back.Reason != reason {
			t.Fatalf("read back %+v", back)
		}
		if back.CheckWorker() != nil {
			t.Fatalf("own letter refused: %v", back.CheckWorker())
		}
		if err := back.VerifyOriginal(subject, orig, data); err != nil {
			t.Fatalf("the digest does not prove the original: %v", err)
		}
		if back.Truncated {
			if !errors.Is(back.Verify(), ErrLetterUnverifiable) || back.OriginalSize != len(data) {
				t.Fatalf("truncated letter: verify %v, size %d of %d", back.Verify(), back.OriginalSize, len(data))
			}
		} else if err := back.Verify(); err != nil {
			t.Fatalf("whole letter does not verify: %v", err)
		}
		if !SameLetter(back, ParseDeadLetter(2, msg.Subject, msg.Header, msg.Data)) {
			t.Fatal("a letter is not the same as itself")
		}
	})
}
