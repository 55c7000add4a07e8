package bothways

import (
	"encoding/json"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
)

// Raw is an event of type typ for key with data, made as a client that
// sets NATS headers itself can make it, past the checks events.New and the
// publisher apply: what an attacker sends, for the runtime's own checks.
// data that is a []byte is taken as it is; anything else is encoded.
func Raw(t testing.TB, typ, key string, data any) event.Event {
	t.Helper()
	raw, ok := data.([]byte)
	if !ok {
		var err error
		if raw, err = json.Marshal(data); err != nil {
			t.Fatalf("the data of a raw %s event does not encode: %v", typ, err)
		}
	}
	e := event.New()
	e.SetType(typ)
	e.SetSubject(key)
	if err := e.SetData("application/json", raw); err != nil {
		t.Fatal(err)
	}
	return e
}
