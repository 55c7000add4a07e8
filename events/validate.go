package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"strconv"
	"strings"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/steward-dev/steward/schema"
)

// New builds an event of a Steward type for a key, with data marshalled to
// JSON. id, time and source are left for the publisher to fill.
func New(typ, key string, data any) (event.Event, error) {
	k, ok := Lookup(typ)
	if !ok {
		return event.Event{}, fmt.Errorf("type %q is not a Steward event type", typ)
	}
	if err := k.CheckKey(key); err != nil {
		return event.Event{}, err
	}
	e := event.New()
	e.SetType(typ)
	e.SetSubject(key)
	raw, ok := data.([]byte)
	if !ok {
		var err error
		if raw, err = json.Marshal(data); err != nil {
			return event.Event{}, fmt.Errorf("marshal data of %s for %s: %w", typ, key, err)
		}
	}
	if err := e.SetData(ContentTypeJSON, raw); err != nil {
		return event.Event{}, err
	}
	return e, nil
}

// ErrInvalid marks every validation failure, so callers can tell bad input
// (never retried) from a failure to reach NATS.
var ErrInvalid = errors.New("invalid event")

// Validate is the one check every event passes before it is published and
// again before a worker handles it: the CloudEvents attributes are present,
// the type is Steward's, the data is JSON that meets its schema, and the
// subject attribute is a valid key equal to the data's key field.
func Validate(e event.Event) error {
	if !plainlyValid(e) {
		if err := e.Validate(); err != nil {
			return fmt.Errorf("%w: attributes: %v", ErrInvalid, err)
		}
	}
	k, ok := Lookup(e.Type())
	if !ok {
		return fmt.Errorf("%w: type %s is not a Steward event type", ErrInvalid, shortQuote(e.Type()))
	}
	if ct := e.DataContentType(); ct != "" && ct != ContentTypeJSON {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != ContentTypeJSON {
			return fmt.Errorf("%w: datacontenttype %s must be %s", ErrInvalid, shortQuote(ct), ContentTypeJSON)
		}
	}
	// The schema's errors name fields and rules, never values, so a
	// secret that fails its rule is not copied into logs and dead letters.
	// The key is read in the same pass that validates the data.
	key, err := schema.ValidateKey(e.Type(), e.Data(), k.KeyField)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if key == "" {
		return fmt.Errorf("%w: data of %s has no string field %q to key it by", ErrInvalid, e.Type(), k.KeyField)
	}
	if err := k.CheckKey(key); err != nil {
		return fmt.Errorf("%w: data field %q: %v", ErrInvalid, k.KeyField, err)
	}
	if e.Subject() != key {
		return fmt.Errorf("%w: subject attribute %s must equal the data's %s %s", ErrInvalid, shortQuote(e.Subject()), k.KeyField, shortQuote(key))
	}
	return nil
}

// shortQuote quotes an attribute for an error: escaped, so control
// characters never reach a log or a header raw, and bounded, so a
// publisher cannot fill a dead letter's reason with it. Only attributes
// and keys are quoted this way; data values never are.
func shortQuote(s string) string {
	const limit = 80
	if len(s) > limit {
		return strconv.Quote(s[:limit]) + "…"
	}
	return strconv.Quote(s)
}

// plainlyValid says, without allocating, that sdk-go's Event.Validate
// would find nothing wrong with e's attributes: a version 1.0 context with
// an id, a type, a source that prints as something, and no optional
// attribute that needs parsing. Anything else is left to Event.Validate,
// which words the refusal.
func plainlyValid(e event.Event) bool {
	ec, ok := e.Context.(*event.EventContextV1)
	if !ok || ec == nil || len(e.FieldErrors) > 0 || ec.DataSchema != nil {
		return false
	}
	src := &ec.Source.URL
	return strings.TrimSpace(ec.ID) != "" && strings.TrimSpace(ec.Type) != "" &&
		(src.Scheme != "" || src.Host != "" || strings.TrimSpace(src.Path) != "" && src.Opaque == "" && src.User == nil) &&
		(ec.DataContentType == nil || *ec.DataContentType == ContentTypeJSON) &&
		(ec.Subject == nil || strings.TrimSpace(*ec.Subject) != "")
}
