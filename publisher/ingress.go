package publisher

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/rs/zerolog"
)

// IngressPath is where the ingress takes events.
const IngressPath = "/events"

// DefaultMaxBody bounds a request body: a batch of signed envelopes fits
// many times over, a runaway upload does not.
const DefaultMaxBody = 1 << 20

// IngressConfig configures an Ingress.
type IngressConfig struct {
	// Token is the bearer token every request must carry. Required: the
	// ingress publishes to the bus, so it is never open.
	Token string
	// MaxBody is the largest request body accepted, in bytes (default
	// DefaultMaxBody).
	MaxBody int64
	// Log receives one line per request (never the token or the data);
	// the zero value discards.
	Log zerolog.Logger
}

// Ingress is the HTTP entry for consoles that cannot speak NATS: POST
// /events takes CloudEvents over HTTP in binary mode (ce-* headers),
// structured mode (application/cloudevents+json) or batch mode
// (application/cloudevents-batch+json), checks them with the same
// validation as Publish, and publishes them.
type Ingress struct {
	pub       *Publisher
	tokenHash [sha256.Size]byte
	maxBody   int64
	log       zerolog.Logger
}

// NewIngress returns the ingress publishing through p.
func NewIngress(p *Publisher, cfg IngressConfig) (*Ingress, error) {
	if strings.TrimSpace(cfg.Token) == "" {
		return nil, errors.New("the ingress token is empty: give --token or --token-file, since an open ingress would let anyone publish")
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	return &Ingress{pub: p, tokenHash: sha256.Sum256([]byte(cfg.Token)), maxBody: cfg.MaxBody, log: cfg.Log}, nil
}

// IngressResponse is the JSON body of every ingress response: the stored
// events on 202 (in request order), or what is wrong otherwise.
type IngressResponse struct {
	Events []Ack  `json:"events,omitempty"`
	Error  string `json:"error,omitempty"`
}

// ServeHTTP implements http.Handler.
func (in *Ingress) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != IngressPath {
		in.reply(w, r, http.StatusNotFound, IngressResponse{Error: fmt.Sprintf("no such path %q: events are posted to %s", r.URL.Path, IngressPath)})
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		in.reply(w, r, http.StatusMethodNotAllowed, IngressResponse{Error: fmt.Sprintf("method %s is not allowed: events are sent with POST", r.Method)})
		return
	}
	if challenge, reason := in.authorize(r); challenge != "" {
		w.Header().Set("WWW-Authenticate", challenge)
		in.reply(w, r, http.StatusUnauthorized, IngressResponse{Error: reason})
		return
	}
	if r.ContentLength > in.maxBody {
		in.reply(w, r, http.StatusRequestEntityTooLarge, IngressResponse{Error: fmt.Sprintf("the body is %d bytes, over the limit of %d", r.ContentLength, in.maxBody)})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, in.maxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			in.reply(w, r, http.StatusRequestEntityTooLarge, IngressResponse{Error: fmt.Sprintf("the body is over the limit of %d bytes", in.maxBody)})
			return
		}
		in.reply(w, r, http.StatusBadRequest, IngressResponse{Error: "the body could not be read: " + err.Error()})
		return
	}
	list, err := decodeRequest(r, body)
	if err != nil {
		in.reply(w, r, http.StatusBadRequest, IngressResponse{Error: err.Error()})
		return
	}
	// Every event is checked before any is published, so a batch with one
	// bad event stores nothing and the console can fix and resend it whole.
	for i := range list {
		if _, err := in.pub.Prepare(&list[i]); err != nil {
			in.reply(w, r, http.StatusBadRequest, IngressResponse{Error: describe(len(list), i, err)})
			return
		}
	}
	acks := make([]Ack, 0, len(list))
	for i, e := range list {
		ack, err := in.pub.Publish(r.Context(), e)
		if err != nil {
			if IsInvalid(err) {
				in.reply(w, r, http.StatusBadRequest, IngressResponse{Events: acks, Error: describe(len(list), i, err)})
				return
			}
			msg := describe(len(list), i, err) + "; NATS did not store it, and resending the request is safe since event ids deduplicate"
			if i > 0 {
				msg += fmt.Sprintf(" (the %d events before it are stored)", i)
			}
			w.Header().Set("Retry-After", "5")
			in.reply(w, r, http.StatusServiceUnavailable, IngressResponse{Events: acks, Error: msg})
			return
		}
		acks = append(acks, ack)
	}
	in.reply(w, r, http.StatusAccepted, IngressResponse{Events: acks})
}

// authorize returns "" when the request carries the token, or the
// challenge (RFC 6750: no error code when no token was sent) and reason to
// refuse it with.
func (in *Ingress) authorize(r *http.Request) (challenge, reason string) {
	const realm = `Bearer realm="steward"`
	h := r.Header.Get("Authorization")
	if h == "" {
		return realm, "no Authorization header: send Authorization: Bearer <token>"
	}
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return realm + `, error="invalid_request"`, "the Authorization header is not a bearer token: send Authorization: Bearer <token>"
	}
	// Hashing first makes the comparison constant-time in the length too.
	got := sha256.Sum256([]byte(strings.TrimSpace(token)))
	if subtle.ConstantTimeCompare(got[:], in.tokenHash[:]) != 1 {
		return realm + `, error="invalid_token"`, "the bearer token is not the ingress token"
	}
	return "", ""
}

// decodeRequest reads the CloudEvents of a request in any of the three HTTP
// content modes.
func decodeRequest(r *http.Request, body []byte) ([]event.Event, error) {
	msg := cehttp.NewMessage(r.Header, io.NopCloser(bytes.NewReader(body)))
	defer msg.Finish(nil)
	ctx := context.WithoutCancel(r.Context())
	switch msg.ReadEncoding() {
	case binding.EncodingBatch:
		list, err := binding.ToEvents(ctx, msg, bytes.NewReader(body))
		if err != nil {
			return nil, fmt.Errorf("the batch is not a JSON array of CloudEvents: %v", err)
		}
		if len(list) == 0 {
			return nil, errors.New("the batch holds no events")
		}
		return list, nil
	case binding.EncodingBinary, binding.EncodingStructured:
		e, err := binding.ToEvent(ctx, msg)
		if err != nil {
			return nil, fmt.Errorf("the body is not a CloudEvent: %v", err)
		}
		return []event.Event{*e}, nil
	}
	return nil, fmt.Errorf("not a CloudEvent: no ce-specversion header (binary mode) and content-type %q is neither application/cloudevents+json nor application/cloudevents-batch+json", r.Header.Get("Content-Type"))
}

// describe names the event a refusal is about when the request held several.
func describe(n, i int, err error) string {
	if n == 1 {
		return err.Error()
	}
	return fmt.Sprintf("event %d of %d in the batch (counting from 0): %v", i, n, err)
}

func (in *Ingress) reply(w http.ResponseWriter, r *http.Request, status int, body IngressResponse) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
	ev := in.log.Info()
	if status >= 400 {
		ev = in.log.Warn().Str("error", body.Error)
	}
	ev.Str("method", r.Method).Str("path", r.URL.Path).Int("status", status).Int("events", len(body.Events)).Msg("ingress request")
}
