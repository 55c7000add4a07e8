package console

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/schema"
)

// publishForm is one event type's form: the page builds its fields from
// Schema, the JSON Schema the ingress validates the data with.
type publishForm struct {
	Type     string
	Schema   string
	KeyField string
	// Sealed says the form seals secrets in the page (an age recipient is
	// asked for); Signed says the type must be signed, and CanPublish is
	// false when it must and this console has no signer.
	Sealed     bool
	Signed     bool
	CanPublish bool
	// Refusal says why it cannot be published from here.
	Refusal string
}

type publishData struct {
	Types []string
	Form  *publishForm
	Error string
}

func (c *Console) publishPage(w http.ResponseWriter, r *http.Request, se *session) {
	d := publishData{Types: schema.Types()}
	if typ := r.URL.Query().Get("type"); typ != "" {
		k, ok := events.Lookup(typ)
		src, err := schema.Source(typ)
		if !ok || err != nil {
			c.fail(w, r, http.StatusNotFound, fmt.Sprintf("%q is not a Steward event type: pick one from the publish page", typ))
			return
		}
		f := &publishForm{Type: typ, Schema: string(src), KeyField: k.KeyField, Signed: mustSign(typ)}
		f.Sealed = typ == events.TypeCredentialRotated || typ == events.TypeGrantChanged
		f.CanPublish = !f.Signed || c.cfg.Signer != nil && c.cfg.Signer.HasKey()
		if !f.CanPublish {
			f.Refusal = unsignedRefusal(typ)
		}
		d.Form = f
	}
	c.render(w, r, http.StatusOK, "publish", se, d)
}

// publishRequest is what the publish form posts: the type and the data,
// its secrets already sealed in the page.
type publishRequest struct {
	Type string          `json:"type"`
	Data json.RawMessage `json:"data"`
}

// PublishResponse answers a publish: where the event was stored and the
// key page that follows it to its outcome.
type PublishResponse struct {
	publisher.Ack
	Follow string `json:"follow,omitempty"`
	Error  string `json:"error,omitempty"`
}

// apiPublish validates, signs when the type must be signed, and publishes
// through the publisher the ingress and `steward publish` use. The data is
// never logged: it holds ciphertext, and a refusal names fields, not
// values.
func (c *Console) apiPublish(w http.ResponseWriter, r *http.Request, se *session) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, publisher.DefaultMaxBody))
	if err != nil {
		writeJSON(w, http.StatusRequestEntityTooLarge, PublishResponse{Error: fmt.Sprintf("the request is over %d bytes: publish fewer or smaller values", publisher.DefaultMaxBody)})
		return
	}
	var req publishRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeJSON(w, http.StatusBadRequest, PublishResponse{Error: "the request is not {type, data} JSON: reload the publish page"})
		return
	}
	if _, ok := events.Lookup(req.Type); !ok {
		writeJSON(w, http.StatusBadRequest, PublishResponse{Error: "not a Steward event type: pick one from the publish page"})
		return
	}
	if mustSign(req.Type) && (c.cfg.Signer == nil || !c.cfg.Signer.HasKey()) {
		writeJSON(w, http.StatusForbidden, PublishResponse{Error: unsignedRefusal(req.Type)})
		return
	}
	key, err := events.KeyOf(req.Type, req.Data)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, PublishResponse{Error: err.Error()})
		return
	}
	e, err := events.New(req.Type, key, []byte(req.Data))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, PublishResponse{Error: err.Error()})
		return
	}
	e.SetSource(Source)
	// Validated before signing, so a signer is never asked to sign what
	// the ingress would refuse, and again by Publish after it.
	if _, err := c.cfg.Publisher.Prepare(&e); err != nil {
		writeJSON(w, http.StatusBadRequest, PublishResponse{Error: err.Error()})
		return
	}
	// The ingress's own hook decides for the login's caller, for every
	// type: a scoped token publishes only its types and keys, and has
	// signed only what its window allows.
	if c.cfg.Signer != nil {
		signed, err := c.cfg.Signer.Sign(r.Context(), se.caller, e)
		if err != nil {
			status := http.StatusBadRequest
			switch {
			case errors.Is(err, publisher.ErrForbidden):
				status = http.StatusForbidden
			case errors.Is(err, publisher.ErrUnavailable):
				status = http.StatusServiceUnavailable
			}
			writeJSON(w, status, PublishResponse{Error: err.Error()})
			return
		}
		e = signed
	}
	ack, err := c.cfg.Publisher.Publish(r.Context(), e)
	if err != nil {
		status := http.StatusServiceUnavailable
		msg := err.Error() + "; publishing again is safe, the event id deduplicates"
		if publisher.IsInvalid(err) {
			status, msg = http.StatusBadRequest, err.Error()
		}
		writeJSON(w, status, PublishResponse{Ack: ack, Error: msg})
		return
	}
	c.cfg.Log.Info().Str("type", req.Type).Str("key", key).Str("id", ack.ID).Uint64("seq", ack.Sequence).Msg("console: published")
	resp := PublishResponse{Ack: ack}
	// The worker that consumes the type, from ops's one table, so a
	// publish is followed to its outcome on that worker's key page.
	if worker := ops.WorkerOf(req.Type); worker != "" {
		resp.Follow = keyURL(worker, key) + "&event=" + url.QueryEscape(ack.ID)
	}
	writeJSON(w, http.StatusAccepted, resp)
}

// unsignedRefusal says why a type that must be signed cannot be published
// from a console without a signer, and what the operator does instead.
func unsignedRefusal(typ string) string {
	return fmt.Sprintf("%s hands out access and must be signed with the controller key, and this console has none: it cannot be published from here. Start the server with a signing key (steward serve --signing-key) to publish it from the console.", typ)
}
