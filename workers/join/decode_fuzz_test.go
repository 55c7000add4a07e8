package join

import (
	"encoding/json"
	"reflect"
	"testing"
)

// FuzzSignedPayloads feeds arbitrary bytes, as a signed payload would
// carry them, to the invitation and host floor decoders. Whatever they
// accept must read the same to a reviewer as to the worker: every key of
// the document, read the way jq reads it (exact names, the last duplicate
// winning), is a field of the struct with the same value (a null is
// absent to both). A payload the two would read differently is refused,
// never decoded one way.
func FuzzSignedPayloads(f *testing.F) {
	seeds := []string{
		`{"v":1,"deployment":"dep","box":"box-1","enrollment":"enr-1","evidenceSHA256":"ab","issuedAt":"2026-03-01T12:00:00Z"}`,
		`{"v":1,"deployment":"dep","minAgentVersion":"1.2.3","binaries":["` + "0000000000000000000000000000000000000000000000000000000000000000" + `"]}`,
		`{"v":1,"enrollment":"enr-1","Enrollment":"enr-evil"}`,
		`{"v":1,"enrollment":"enr-1","enrollment":"enr-evil"}`,
		`{"v":1,"minAgentVersion":"9.0.0","MinAgentVersion":"0.0.1"}`,
		`{"v":1,"binaries":["a"],"binaries":["b"]}`,
		`{"V":1,"v":2}`,
		`{"v":1,"\u0065nrollment":"enr-1"}`,
		`{"v":1,"enrollment":"enr-1"} {"v":1}`,
		`{"v":1,"evidence\u017fHA256":"x"}`,
		`{"v":1,"deployment":null,"binaries":null}`,
		`{"v":1.0}`,
		`null`,
		`[]`,
		`{"v":1,"box":"\ud800"}`,
		"{\"v\":1,\"box\xff\":\"a\",\"box\xfe\":\"b\"}",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		if inv, rule, _ := decodeInvitation(payload); rule == "" {
			sameToReviewer(t, payload, inv)
		}
		if floor, rule, _ := decodeFloor(payload); rule == "" {
			sameToReviewer(t, payload, floor)
		}
	})
}

// sameToReviewer fails when an accepted payload holds a key that is not a
// field of doc, or a value other than the one doc holds.
func sameToReviewer(t *testing.T, payload []byte, doc any) {
	t.Helper()
	var reviewer map[string]any
	if err := json.Unmarshal(payload, &reviewer); err != nil {
		t.Fatalf("accepted %q, which is not a JSON object: %v", payload, err)
	}
	raw, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var worker map[string]any
	if err := json.Unmarshal(raw, &worker); err != nil {
		t.Fatal(err)
	}
	for k, v := range reviewer {
		w, ok := worker[k]
		if !ok {
			t.Fatalf("accepted %q: key %q is not a field the worker reads", payload, k)
		}
		// A null reads as absent to both: Go leaves the field at its zero
		// value, and every check treats an empty value as missing.
		if v == nil && (w == nil || reflect.ValueOf(w).IsZero()) {
			continue
		}
		if !reflect.DeepEqual(v, w) {
			t.Fatalf("accepted %q: a reviewer reads %q as %#v, the worker as %#v", payload, k, v, w)
		}
	}
}
