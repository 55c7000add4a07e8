package events

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/nats-io/nats.go"
)

// The CloudEvents NATS binding puts attributes in "ce-" headers and the
// data's media type in "content-type".
const (
	headerPrefix      = "ce-"
	headerContentType = "content-type"
)

// MsgIDHeader is JetStream's dedupe header; Steward sets it to the event id.
const MsgIDHeader = nats.MsgIdHdr

var natsSpecs = spec.WithPrefixMatchExact(func(name string) string {
	if name == "datacontenttype" {
		return headerContentType
	}
	return headerPrefix + name
}, headerPrefix)

// Encode returns the NATS message that carries e on subject in binary
// content mode, with Nats-Msg-Id set to the event id so that JetStream
// drops a republished copy inside its dedupe window.
func Encode(subject string, e event.Event) (*nats.Msg, error) {
	msg := nats.NewMsg(subject)
	w := &headerWriter{msg: msg}
	ctx := binding.WithForceBinary(context.Background())
	if _, err := binding.Write(ctx, binding.ToMessage(&e), nil, w); err != nil {
		return nil, fmt.Errorf("encode event %s: %w", e.ID(), err)
	}
	msg.Header.Set(MsgIDHeader, e.ID())
	return msg, nil
}

// EncodeStructured returns the NATS message that carries e in structured
// content mode (the JSON event format as the payload). Steward writes binary
// mode; this exists for tests and for tools that prefer structured mode.
func EncodeStructured(subject string, e event.Event) (*nats.Msg, error) {
	body, err := format.JSON.Marshal(&e)
	if err != nil {
		return nil, fmt.Errorf("encode event %s: %w", e.ID(), err)
	}
	msg := nats.NewMsg(subject)
	msg.Header.Set(headerContentType, event.ApplicationCloudEventsJSON)
	msg.Header.Set(MsgIDHeader, e.ID())
	msg.Data = body
	return msg, nil
}

// ErrNotCloudEvent says a message carries neither a "ce-specversion" header
// nor a structured CloudEvents content type.
var ErrNotCloudEvent = errors.New("message is not a CloudEvent: no ce-specversion header and content-type is not application/cloudevents+json")

// Decode reads the event carried by NATS headers and payload, in binary or
// structured content mode. Header names are matched case-insensitively, so
// any NATS client that sets headers can publish.
//
// The event's data is the payload itself, not a copy: the payload must not
// change while the event is in use.
func Decode(header nats.Header, data []byte) (event.Event, error) {
	if e, ok := decodeBinary(header, data); ok {
		return e, nil
	}
	return decodeSDK(header, data)
}

// decodeSDK is sdk-go's reading of any message, in either mode.
func decodeSDK(header nats.Header, data []byte) (event.Event, error) {
	m := newMessage(header, data)
	if m.ReadEncoding() == binding.EncodingUnknown {
		return event.Event{}, ErrNotCloudEvent
	}
	e, err := binding.ToEvent(context.Background(), m)
	if err != nil {
		return event.Event{}, fmt.Errorf("decode CloudEvent: %w", err)
	}
	if m.format != nil {
		// The JSON format keeps the white space around an id that
		// the headers' setter trims: read it the same in both modes,
		// so re-encoding a structured event keeps its id.
		e.SetID(e.ID())
	}
	return *e, nil
}

// decodeBinary reads what Steward itself publishes, a binary-mode event
// of version 1.0, with the setters sdk-go's reading uses, but without
// copying the headers into a map of their own, the data into a buffer of
// its own, or an attribute through the binding's interfaces. It reports
// false for anything else, and for anything sdk-go might read differently
// or refuse (a header repeated under two spellings, a percent sign, an
// attribute a setter refuses), which decodeSDK then reads, or refuses in
// its own words. FuzzDecode holds the two to the same events.
func decodeBinary(header nats.Header, data []byte) (event.Event, bool) {
	ec := &event.EventContextV1{}
	var seen uint16
	for k, vs := range header {
		if len(vs) == 0 {
			continue
		}
		v := vs[0]
		if len(k) < len(headerPrefix) || !strings.EqualFold(k[:len(headerPrefix)], headerPrefix) {
			if !strings.EqualFold(k, headerContentType) {
				continue
			}
			if v != ContentTypeJSON || seen&seenContentType != 0 {
				return event.Event{}, false
			}
			seen |= seenContentType
			ct := ContentTypeJSON
			ec.DataContentType = &ct
			continue
		}
		name := k[len(headerPrefix):]
		v = percentDecode(v)
		bit, set := attributeOf(name)
		if bit == 0 {
			// An extension: only a plain lower-case name, once.
			if !plainLower(name) {
				return event.Event{}, false
			}
			if _, dup := ec.Extensions[name]; dup {
				return event.Event{}, false
			}
			if err := ec.SetExtension(name, v); err != nil {
				return event.Event{}, false
			}
			continue
		}
		if seen&bit != 0 {
			return event.Event{}, false
		}
		seen |= bit
		if set == nil {
			if v != event.CloudEventsVersionV1 {
				return event.Event{}, false
			}
			continue
		}
		if err := set(ec, v); err != nil {
			return event.Event{}, false
		}
	}
	if seen&seenSpecVersion == 0 {
		return event.Event{}, false
	}
	e := event.Event{Context: ec}
	if len(data) > 0 {
		e.DataEncoded = data
	}
	return e, true
}

// The attributes decodeBinary reads, each once.
const (
	seenSpecVersion uint16 = 1 << iota
	seenID
	seenSource
	seenType
	seenSubject
	seenTime
	seenContentType
)

// attributeOf returns the bit and the setter of a "ce-" header's name,
// matched case-insensitively; a bit of 0 is an extension, a nil setter the
// specversion.
func attributeOf(name string) (uint16, func(*event.EventContextV1, string) error) {
	switch {
	case strings.EqualFold(name, "specversion"):
		return seenSpecVersion, nil
	case strings.EqualFold(name, "id"):
		return seenID, (*event.EventContextV1).SetID
	case strings.EqualFold(name, "source"):
		return seenSource, (*event.EventContextV1).SetSource
	case strings.EqualFold(name, "type"):
		return seenType, (*event.EventContextV1).SetType
	case strings.EqualFold(name, "subject"):
		return seenSubject, (*event.EventContextV1).SetSubject
	case strings.EqualFold(name, "time"):
		return seenTime, setTime
	}
	return 0, nil
}

// setTime parses a time as sdk-go's binding does (types.ToTime, without
// boxing the string).
func setTime(ec *event.EventContextV1, v string) error {
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return err
	}
	return ec.SetTime(t)
}

// plainLower says an extension's name is lower-case letters and digits,
// as sdk-go stores it; SetExtension refuses the rest of what it would.
func plainLower(name string) bool {
	for i := 0; i < len(name); i++ {
		if c := name[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return name != ""
}

// message adapts NATS headers and payload to sdk-go's binding.Message.
type message struct {
	header  map[string]string // lower-cased names, first value
	data    []byte
	format  format.Format
	version spec.Version
}

func newMessage(header nats.Header, data []byte) *message {
	m := &message{header: make(map[string]string, len(header)), data: data}
	for k, v := range header {
		if len(v) > 0 {
			m.header[strings.ToLower(k)] = v[0]
		}
	}
	if ct := m.header[headerContentType]; ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err == nil && strings.HasPrefix(mt, "application/cloudevents") {
			if f := format.Lookup(mt); f != nil && f != format.JSONBatch {
				m.format = f
				return m
			}
		}
	}
	if sv, ok := m.header[headerPrefix+"specversion"]; ok {
		m.version = natsSpecs.Version(percentDecode(sv))
	}
	return m
}

var (
	_ binding.Message               = (*message)(nil)
	_ binding.MessageMetadataReader = (*message)(nil)
)

func (m *message) ReadEncoding() binding.Encoding {
	switch {
	case m.format != nil:
		return binding.EncodingStructured
	case m.version != nil:
		return binding.EncodingBinary
	}
	return binding.EncodingUnknown
}

func (m *message) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	if m.format == nil {
		return binding.ErrNotStructured
	}
	return w.SetStructuredEvent(ctx, m.format, bytes.NewReader(m.data))
}

func (m *message) ReadBinary(_ context.Context, w binding.BinaryWriter) error {
	if m.version == nil {
		return binding.ErrNotBinary
	}
	for k, v := range m.header {
		var err error
		if attr := m.version.Attribute(k); attr != nil {
			if attr.Kind() == spec.DataContentType {
				err = w.SetAttribute(attr, v)
			} else {
				err = w.SetAttribute(attr, percentDecode(v))
			}
		} else if name, ok := strings.CutPrefix(k, headerPrefix); ok && name != "" {
			err = w.SetExtension(name, percentDecode(v))
		}
		if err != nil {
			return fmt.Errorf("header %q: %w", k, err)
		}
	}
	if len(m.data) > 0 {
		return w.SetData(bytes.NewReader(m.data))
	}
	return nil
}

func (m *message) GetAttribute(k spec.Kind) (spec.Attribute, interface{}) {
	attr := m.version.AttributeFromKind(k)
	if attr == nil {
		return nil, nil
	}
	if v, ok := m.header[attr.PrefixedName()]; ok {
		return attr, percentDecode(v)
	}
	if k == spec.DataContentType {
		if v, ok := m.header[headerContentType]; ok {
			return attr, v
		}
	}
	return attr, nil
}

func (m *message) GetExtension(name string) interface{} {
	if v, ok := m.header[headerPrefix+strings.ToLower(name)]; ok {
		return percentDecode(v)
	}
	return nil
}

func (m *message) Finish(error) error { return nil }

// headerWriter writes a binary-mode event into a NATS message.
type headerWriter struct{ msg *nats.Msg }

func (w *headerWriter) Start(context.Context) error { return nil }
func (w *headerWriter) End(context.Context) error   { return nil }

func (w *headerWriter) SetAttribute(attr spec.Attribute, value interface{}) error {
	if value == nil {
		return nil
	}
	s, err := types.Format(value)
	if err != nil {
		return err
	}
	if attr.Kind() == spec.DataContentType {
		w.msg.Header.Set(headerContentType, s)
		return nil
	}
	w.msg.Header.Set(headerPrefix+attr.Name(), percentEncode(s))
	return nil
}

func (w *headerWriter) SetExtension(name string, value interface{}) error {
	if value == nil {
		return nil
	}
	s, err := types.Format(value)
	if err != nil {
		return err
	}
	w.msg.Header.Set(headerPrefix+strings.ToLower(name), percentEncode(s))
	return nil
}

func (w *headerWriter) SetData(r io.Reader) error {
	data, err := io.ReadAll(r)
	w.msg.Data = data
	return err
}

// percentEncode escapes what the CloudEvents header rules require: space,
// '"', '%' and every byte outside printable ASCII (so UTF-8 survives).
func percentEncode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= 0x20 || c >= 0x7f || c == '"' || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// percentDecode reverses percentEncode; a '%' not followed by two hex digits
// is kept as it is, since a lenient reader loses nothing a publisher meant.
func percentDecode(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if h, ok := unhex(s[i+1]); ok {
				if l, ok := unhex(s[i+2]); ok {
					b.WriteByte(h<<4 | l)
					i += 2
					continue
				}
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
