package events

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"github.com/cloudevents/sdk-go/v2/event"
)

// ReadJSONL reads CloudEvents in the JSON event format, one per line, as
// `steward export` writes them. Blank lines are ignored; a bad line is
// reported by its number.
func ReadJSONL(r io.Reader) ([]event.Event, error) {
	var out []event.Event
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var e event.Event
		if err := json.Unmarshal(line, &e); err != nil {
			return out, fmt.Errorf("line %d: not a CloudEvent in the JSON format: %w", n, err)
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// WriteJSONL writes one event as a line of the JSON event format.
func WriteJSONL(w io.Writer, e event.Event) error {
	raw, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("event %s: %w", e.ID(), err)
	}
	_, err = w.Write(append(raw, '\n'))
	return err
}
