package console

import (
	"net/http"
	"strings"

	"github.com/steward-dev/steward/internal/ops"
)

// keysData is the keys of one worker that start with a prefix, as
// ops.ListKeys counts them.
type keysData struct {
	Worker, Prefix string
	Workers        []string
	List           *ops.KeyList
	Error          string
}

func (c *Console) keysPage(w http.ResponseWriter, r *http.Request, se *session) {
	q := r.URL.Query()
	d := keysData{Worker: strings.TrimSpace(q.Get("worker")), Prefix: strings.TrimSpace(q.Get("prefix")), Workers: ops.Workers()}
	if d.Worker == "" {
		d.Worker = d.Workers[0]
	}
	list, err := ops.ListKeys(r.Context(), c.cfg.JS, ops.KeyOptions{Worker: d.Worker, Prefix: d.Prefix})
	if err != nil {
		d.Error = err.Error()
	}
	d.List = list
	c.render(w, r, http.StatusOK, "keys", se, d)
}
