package publisher

import (
	"bytes"
	"context"
	"net/http"
	"net/textproto"
	"strings"
	"unicode"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
)

// httpMessage reads a request's headers and body as sdk-go's HTTP binding
// does (binary mode in Ce-* headers, structured and batch mode by
// content-type), without importing that binding: its package starts a zap
// logger when initialised, about 1 MB resident in every process of the one
// binary, and the ingress needs only this reading of it.
type httpMessage struct {
	header  http.Header
	body    []byte
	format  format.Format
	version spec.Version
}

// httpPrefix is the binary mode's attribute header prefix, as
// net/http canonicalises it.
const httpPrefix = "Ce-"

// httpSpecs names each attribute's header: Content-Type for
// datacontenttype, Ce-<name> for the rest.
var httpSpecs = spec.WithPrefixMatchExact(func(name string) string {
	if name == "datacontenttype" {
		return "Content-Type"
	}
	return textproto.CanonicalMIMEHeaderKey(httpPrefix + name)
}, httpPrefix)

var (
	_ binding.Message               = (*httpMessage)(nil)
	_ binding.MessageMetadataReader = (*httpMessage)(nil)
)

func newHTTPMessage(header http.Header, body []byte) *httpMessage {
	m := &httpMessage{header: header, body: body}
	if m.format = format.Lookup(header.Get("Content-Type")); m.format == nil {
		m.version = httpSpecs.Version(header.Get(httpSpecs.PrefixedSpecVersionName()))
	}
	return m
}

func (m *httpMessage) ReadEncoding() binding.Encoding {
	switch {
	case m.version != nil:
		return binding.EncodingBinary
	case m.format == format.JSONBatch:
		return binding.EncodingBatch
	case m.format != nil:
		return binding.EncodingStructured
	}
	return binding.EncodingUnknown
}

func (m *httpMessage) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	if m.format == nil {
		return binding.ErrNotStructured
	}
	return w.SetStructuredEvent(ctx, m.format, bytes.NewReader(m.body))
}

func (m *httpMessage) ReadBinary(_ context.Context, w binding.BinaryWriter) error {
	if m.version == nil {
		return binding.ErrNotBinary
	}
	for k, v := range m.header {
		var err error
		if attr := m.version.Attribute(k); attr != nil {
			err = w.SetAttribute(attr, v[0])
		} else if strings.HasPrefix(k, httpPrefix) && len(k) > len(httpPrefix) {
			// An extension's name is the header's after the prefix, its
			// first letter lowered back from net/http's canonical form.
			err = w.SetExtension(string(unicode.ToLower(rune(k[len(httpPrefix)])))+k[len(httpPrefix)+1:], v[0])
		}
		if err != nil {
			return err
		}
	}
	return w.SetData(bytes.NewReader(m.body))
}

// GetAttribute and GetExtension are what sdk-go's binary-mode reading
// asks of a message besides ReadBinary.
func (m *httpMessage) GetAttribute(k spec.Kind) (spec.Attribute, any) {
	attr := m.version.AttributeFromKind(k)
	if attr == nil {
		return nil, nil
	}
	if h := m.header[attr.PrefixedName()]; h != nil {
		return attr, h[0]
	}
	return attr, nil
}

func (m *httpMessage) GetExtension(name string) any {
	if h := m.header[textproto.CanonicalMIMEHeaderKey(httpPrefix+name)]; h != nil {
		return h[0]
	}
	return nil
}

func (m *httpMessage) Finish(error) error { return nil }
