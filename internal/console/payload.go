package console

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/ops"
)

// payloadData is one history entry's payload, as ops.GetMessage reads
// it, and the key page it belongs to.
type payloadData struct {
	Message     *ops.Message
	Worker, Key string
}

// payloadURL is the payload view of a history entry: an event's or an
// outcome's own page, a dead letter's the letter page (which also says
// what a retry would do).
func payloadURL(worker string, e ops.Entry) string {
	if e.Kind == ops.EntryDeadLetter {
		return fmt.Sprintf("/dlq/%d", e.Sequence)
	}
	return fmt.Sprintf("/payload/%s/%d?", url.PathEscape(e.Stream), e.Sequence) + url.Values{"worker": {worker}, "key": {e.Key}}.Encode()
}

// eventURL is the row of event id on its key's page.
func eventURL(worker, key, id string) string {
	return keyURL(worker, key) + "#event-" + url.PathEscape(id)
}

func (c *Console) payloadPage(w http.ResponseWriter, r *http.Request, se *session) {
	stream := r.PathValue("stream")
	seq, err := strconv.ParseUint(r.PathValue("seq"), 10, 64)
	if err != nil || seq == 0 {
		c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("%q is not a stream sequence: open a payload from a key's history", r.PathValue("seq")))
		return
	}
	if stream == events.StreamDLQ {
		http.Redirect(w, r, fmt.Sprintf("/dlq/%d", seq), http.StatusSeeOther)
		return
	}
	m, err := ops.GetMessage(r.Context(), c.cfg.JS, stream, seq, ops.ProofsOf(c.cfg.Docs), ops.EnvelopeKeys{Controller: c.cfg.ControllerKeys})
	if err != nil {
		c.fail(w, r, http.StatusNotFound, err.Error())
		return
	}
	q := r.URL.Query()
	d := payloadData{Message: m, Worker: q.Get("worker"), Key: m.Key}
	if d.Worker == "" || events.CheckKey(d.Worker) != nil {
		d.Worker = ops.WorkerOf(m.Type)
	}
	if m.Stream == events.StreamOutcomes {
		if w := outcomeWorker(m.Subject); w != "" {
			d.Worker = w
		}
	}
	c.render(w, r, http.StatusOK, "payload", se, d)
}

// outcomeWorker is the worker an outcome subject names
// (steward.outcomes.<worker>.<instance>).
func outcomeWorker(subject string) string {
	rest, ok := strings.CutPrefix(subject, events.OutcomesPrefix+".")
	if !ok {
		return ""
	}
	worker, _, ok := strings.Cut(rest, ".")
	if !ok {
		return ""
	}
	return worker
}
