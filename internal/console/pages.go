package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/internal/redact"
)

// pageNames are the templates that are whole pages; each is parsed with
// layout.html. Fragments (the live parts) are defined inside them.
var pageNames = []string{"login", "overview", "key", "keys", "payload", "dlq", "letter", "confirm", "done", "publish", "error"}

func parseTemplates(traceTemplate string) (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"traceURL":   func(id string) string { return traceURL(traceTemplate, id) },
		"payloadURL": payloadURL,
		"eventURL":   eventURL,
		"ts":         func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
		"tsp":        func(t *time.Time) string { return tsp(t) },
		"ago":        ago,
		"keyURL":     keyURL,
		"dlqURL":     func(worker string) string { return "/dlq?worker=" + url.QueryEscape(worker) },
		"short": func(s string, n int) string {
			if len([]rune(s)) <= n {
				return s
			}
			return string([]rune(s)[:n]) + "…"
		},
		"seconds": func(f float64) string { return (time.Duration(f) * time.Second).Round(time.Second).String() },
		"join":    strings.Join,
		// forgedNote is what to do about forged entries, worded once for
		// the console and steward history alike.
		"forgedNote": func() string { return ops.ForgedNote },
		"verdict":    verdictOf,
		"keyQuery": func(d keyData) string {
			v := url.Values{"worker": {d.Worker}, "key": {d.Key}}
			if d.Instance != "" {
				v.Set("instance", d.Instance)
			}
			if d.Follow != "" {
				v.Set("event", d.Follow)
			}
			return v.Encode()
		},
	}
	out := map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFiles, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console template %s: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

// verdict is what became of an event, as a history row shows it: the word
// and a CSS class, so a refusal, a supersede and a dead letter are told
// apart by someone who cannot tell the colours apart too.
type verdict struct{ Word, Class string }

// verdictOf is an entry's verdict. The class is chosen from a fixed set,
// never from the outcome's name, which whoever could publish wrote.
func verdictOf(e ops.Entry) verdict {
	switch e.Kind {
	case ops.EntryEvent:
		return verdict{"event", "verdict-event"}
	case ops.EntryDeadLetter:
		return verdict{"dead-lettered", "verdict-dead-lettered"}
	}
	if class, ok := outcomeClasses[e.Outcome]; ok {
		return verdict{e.Outcome, class}
	}
	return verdict{"outcome " + e.Outcome, "verdict-other"}
}

// outcomeClasses colour the workers' outcomes by what they mean: done
// (applied, succeeded, armed, a floor accepted), refused, set aside
// without harm (superseded, a stale version skipped, a floor kept), or
// failed. The word shown is the outcome's own.
var outcomeClasses = map[string]string{
	"applied": "verdict-applied", "succeeded": "verdict-applied", "armed": "verdict-applied",
	"armed-already": "verdict-applied", "floor-accepted": "verdict-applied",
	"refused": "verdict-refused", "floor-refused": "verdict-refused",
	"superseded": "verdict-superseded", "skipped": "verdict-superseded", "floor-kept": "verdict-superseded",
	"failed": "verdict-failed",
}

func tsp(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// ago says how long before now t was, to the second.
func ago(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	d := time.Since(*t).Round(time.Second)
	if d < 0 {
		return "in " + (-d).String()
	}
	return d.String() + " ago"
}

// keyURL is the key page of one key of one worker: every place the console
// shows a key links to it.
func keyURL(worker, key string) string {
	return "/key?" + url.Values{"worker": {worker}, "key": {key}}.Encode()
}

func (c *Console) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /login", c.loginPage)
	m.HandleFunc("POST /login", c.login)
	m.HandleFunc("GET /static/style.css", c.static.ServeHTTP) // the login page's look, nothing else
	m.Handle("GET /static/", c.authed(func(w http.ResponseWriter, r *http.Request, _ *session) { c.static.ServeHTTP(w, r) }))
	m.Handle("POST /logout", c.authed(c.logout))
	m.Handle("GET /{$}", c.authed(c.overview))
	m.Handle("GET /overview/live", c.authed(c.overviewLive))
	m.Handle("POST /pause", c.authed(c.pause))
	m.Handle("GET /key", c.authed(c.keyPage))
	m.Handle("GET /key/live", c.authed(c.keyLive))
	m.Handle("GET /keys", c.authed(c.keysPage))
	m.Handle("GET /payload/{stream}/{seq}", c.authed(c.payloadPage))
	m.Handle("GET /dlq", c.authed(c.dlqPage))
	m.Handle("GET /dlq/{seq}", c.authed(c.letterPage))
	m.Handle("POST /dlq/confirm", c.authed(c.dlqConfirm))
	m.Handle("POST /dlq/act", c.authed(c.dlqAct))
	m.Handle("GET /publish", c.authed(c.publishPage))
	m.Handle("POST /api/publish", c.authed(c.apiPublish))
	// Anything else is 404 to a logged-in operator, and the login page or
	// 401 to anyone else: no path says whether it exists without a login.
	m.Handle("/", c.authed(func(w http.ResponseWriter, r *http.Request, _ *session) {
		c.fail(w, r, http.StatusNotFound, fmt.Sprintf("no console page at %s: start from the overview", r.URL.Path))
	}))
	c.mux = m
}

// view is what every page template gets.
type view struct {
	Title string
	Nav   string
	CSRF  string
	Data  any
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, page string, se *session, data any) {
	c.renderTemplate(w, status, page, "layout.html", se, data)
}

// renderFragment renders one template defined inside a page, for the live
// parts that scripts fetch and swap in.
func (c *Console) renderFragment(w http.ResponseWriter, page, fragment string, se *session, data any) {
	c.renderTemplate(w, http.StatusOK, page, fragment, se, data)
}

func (c *Console) renderTemplate(w http.ResponseWriter, status int, page, name string, se *session, data any) {
	v := view{Nav: page, Data: data}
	if se != nil {
		v.CSRF = se.csrf
	}
	var buf bytes.Buffer
	if err := c.pages[page].ExecuteTemplate(&buf, name, v); err != nil {
		c.cfg.Log.Error().Err(err).Str("page", page).Msg("console template failed")
		http.Error(w, "the console could not render this page; its log says why", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = buf.WriteTo(w)
}

// fail answers with what went wrong: JSON to scripts, a page to people.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	if strings.HasPrefix(r.URL.Path, "/api/") || r.Header.Get("X-Console-Fetch") != "" {
		writeJSON(w, status, map[string]string{"error": msg})
		return
	}
	c.render(w, r, status, "error", c.sessionOf(r), map[string]any{"Status": status, "Message": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// overviewData is what ops.GetStatus computes, as `steward status` shows
// it, and on the unfiltered overview the charts of the last hour: every
// worker's backlog and what was stored and settled per minute
// (ops.GetActivity).
type overviewData struct {
	Status *ops.Status
	Error  string
	Worker string
	Charts []chart
	// ChartError says why the charts could not be drawn.
	ChartError string
}

func (c *Console) overviewData(r *http.Request) overviewData {
	worker := r.URL.Query().Get("worker")
	st, err := ops.GetStatus(r.Context(), c.cfg.JS, ops.StatusOptions{Worker: worker, Limit: 200, Docs: c.cfg.Docs})
	d := overviewData{Status: st, Worker: worker}
	if err != nil {
		d.Error = err.Error()
		return d
	}
	if worker != "" {
		// The streams' counts are every worker's, so the charts are on
		// the unfiltered overview only.
		return d
	}
	a, err := ops.GetActivity(r.Context(), c.cfg.JS, ops.ActivityOptions{Now: c.cfg.Now(), Backlog: st.Backlog, Index: c.times})
	if err != nil {
		d.ChartError = err.Error()
		return d
	}
	d.Charts = charts(a)
	return d
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request, se *session) {
	c.render(w, r, http.StatusOK, "overview", se, c.overviewData(r))
}

func (c *Console) overviewLive(w http.ResponseWriter, r *http.Request, se *session) {
	c.renderFragment(w, "overview", "live", se, c.overviewData(r))
}

// pause pauses or resumes one instance through ops, as `steward pause`
// and `steward resume` do.
func (c *Console) pause(w http.ResponseWriter, r *http.Request, _ *session) {
	worker, instance := r.PostFormValue("worker"), r.PostFormValue("instance")
	var err error
	var what string
	if r.PostFormValue("action") == "resume" {
		_, err = ops.Resume(r.Context(), c.cfg.JS, c.cfg.Docs, worker, instance)
		what = "resumed"
	} else {
		d, perr := time.ParseDuration(r.PostFormValue("for"))
		if perr != nil || d <= 0 {
			c.fail(w, r, http.StatusBadRequest, "pause for how long? give a duration such as 15m or 1h")
			return
		}
		_, err = ops.Pause(r.Context(), c.cfg.JS, c.cfg.Docs, worker, instance, c.cfg.Now().Add(d))
		what = "paused for " + d.String()
	}
	if err != nil {
		c.fail(w, r, http.StatusConflict, err.Error())
		return
	}
	c.cfg.Log.Info().Str("worker", worker).Str("instance", instance).Str("action", what).Msg("console: instance " + what)
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// keyData is ops.GetHistory's history of one key, with the event the page
// follows after a publish.
type keyData struct {
	Worker, Key, Instance string
	Follow                string
	History               *ops.History
	// Checkpoints are the key's checkpoints per instance: what each
	// applied last and the stage its handler saved.
	Checkpoints []ops.Checkpoint
	Error       string
	// Settled is the outcome or dead letter of the followed event, if any.
	Settled *ops.Entry
}

func (c *Console) keyData(r *http.Request) keyData {
	q := r.URL.Query()
	d := keyData{Worker: q.Get("worker"), Key: q.Get("key"), Instance: q.Get("instance"), Follow: q.Get("event")}
	h, err := ops.GetHistory(r.Context(), c.cfg.JS, ops.HistoryOptions{Worker: d.Worker, Key: d.Key, Instance: d.Instance, Proofs: ops.ProofsOf(c.cfg.Docs)})
	if err != nil {
		d.Error = err.Error()
		return d
	}
	d.History = h
	if d.Checkpoints, err = ops.GetCheckpoints(r.Context(), c.cfg.JS, c.cfg.Docs, d.Worker, d.Key, d.Instance); err != nil {
		d.Error = err.Error()
	}
	if d.Follow != "" {
		// The settlement that counts is the one after the event's last
		// delivery to the stream: a redriven event was dead-lettered once,
		// and its new outcome is what the page waits for.
		for i, e := range h.Entries {
			switch {
			case e.Kind == ops.EntryEvent && e.ID == d.Follow:
				d.Settled = nil
			case e.Kind != ops.EntryEvent && e.CausationID == d.Follow && e.Forged == "":
				// A forged outcome naming the event settles nothing:
				// the page waits for the instance's own.
				d.Settled = &h.Entries[i]
			}
		}
	}
	return d
}

func (c *Console) keyPage(w http.ResponseWriter, r *http.Request, se *session) {
	c.render(w, r, http.StatusOK, "key", se, c.keyData(r))
}

func (c *Console) keyLive(w http.ResponseWriter, r *http.Request, se *session) {
	c.renderFragment(w, "key", "live", se, c.keyData(r))
}

// dlqData is the dead letters a filter selects, read by ops.ListLetters
// as `steward dlq ls` reads them.
type dlqData struct {
	Filter  ops.LetterFilter
	Since   string
	Until   string
	Letters []ops.Letter
	Types   []string
	Error   string
}

// parseFilter reads the dead-letter page's filter into the ops filter
// `steward dlq` uses. Times are when the letter was stored, in UTC unless
// they say otherwise.
func parseFilter(q url.Values) (ops.LetterFilter, error) {
	f := ops.LetterFilter{Worker: strings.TrimSpace(q.Get("worker")), Type: q.Get("type"), Key: strings.TrimSpace(q.Get("key")), Reason: strings.TrimSpace(q.Get("reason"))}
	for _, p := range []struct {
		name string
		into *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		v := strings.TrimSpace(q.Get(p.name))
		if v == "" {
			continue
		}
		t, err := parseTime(v)
		if err != nil {
			return f, fmt.Errorf("%s %q is not a time: give 2006-01-02T15:04 (UTC) or RFC 3339", p.name, v)
		}
		*p.into = t
	}
	return f, nil
}

func parseTime(v string) (time.Time, error) {
	for _, layout := range []string{time.RFC3339, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, v, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("not a time")
}

func (c *Console) dlqPage(w http.ResponseWriter, r *http.Request, se *session) {
	q := r.URL.Query()
	d := dlqData{Since: q.Get("since"), Until: q.Get("until")}
	for _, k := range events.Kinds() {
		d.Types = append(d.Types, k.Type)
	}
	f, err := parseFilter(q)
	d.Filter = f
	if err != nil {
		d.Error = err.Error()
	} else if list, err := ops.ListLetters(r.Context(), c.cfg.JS, f, ops.ProofsOf(c.cfg.Docs)); err != nil {
		d.Error = err.Error()
	} else {
		d.Letters = list.Letters
	}
	c.render(w, r, http.StatusOK, "dlq", se, d)
}

func (c *Console) letterPage(w http.ResponseWriter, r *http.Request, se *session) {
	seq, err := strconv.ParseUint(r.PathValue("seq"), 10, 64)
	if err != nil || seq == 0 {
		c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("%q is not a %s sequence: pick a letter from the dead-letter page", r.PathValue("seq"), events.StreamDLQ))
		return
	}
	l, err := ops.GetLetter(r.Context(), c.cfg.JS, seq, ops.ProofsOf(c.cfg.Docs))
	if err != nil {
		c.fail(w, r, http.StatusNotFound, err.Error())
		return
	}
	d := letterData{LetterDetail: ops.Detail(l)}
	if l.Raw.Event != nil && !l.Truncated {
		d.Envelope = ops.EnvelopeKeys{Controller: c.cfg.ControllerKeys}.Check(*l.Raw.Event)
	}
	c.render(w, r, http.StatusOK, "letter", se, d)
}

// letterData is one dead letter as `steward dlq show` prints it, and what
// its event's envelope proves, as the payload view says it.
type letterData struct {
	ops.LetterDetail
	Envelope *ops.EnvelopeCheck
}

// selected reads the sequences a dead-letter form chose.
func selected(r *http.Request) ([]uint64, error) {
	if err := r.ParseForm(); err != nil {
		return nil, err
	}
	var out []uint64
	for _, v := range r.PostForm["seq"] {
		seq, err := strconv.ParseUint(v, 10, 64)
		if err != nil || seq == 0 {
			return nil, fmt.Errorf("%q is not a %s sequence", v, events.StreamDLQ)
		}
		if !slices.Contains(out, seq) {
			out = append(out, seq)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no dead letter selected: tick the letters to act on, then choose retry or remove")
	}
	return out, nil
}

type confirmData struct {
	Action  string
	Letters []ops.Letter
	Missing []uint64
	Back    string
}

// selectedLetters reads the letters at seqs as they are now, and the
// sequences that hold none any more.
func (c *Console) selectedLetters(r *http.Request, seqs []uint64) ([]ops.Letter, []uint64, error) {
	list, err := ops.ListLetters(r.Context(), c.cfg.JS, ops.LetterFilter{Seqs: seqs}, ops.ProofsOf(c.cfg.Docs))
	if err != nil {
		return nil, nil, err
	}
	var missing []uint64
	for _, seq := range seqs {
		if !slices.ContainsFunc(list.Letters, func(l ops.Letter) bool { return l.Sequence == seq }) {
			missing = append(missing, seq)
		}
	}
	return list.Letters, missing, nil
}

func dlqAction(r *http.Request) (string, error) {
	switch a := r.PostFormValue("action"); a {
	case ops.ActionRetry, ops.ActionRemove:
		return a, nil
	}
	return "", errors.New("choose retry or remove")
}

// dlqConfirm asks before acting, saying how many letters the action
// touches and which, as they are now (a letter retried meanwhile is named
// as gone, not silently dropped), in the order the action takes them.
func (c *Console) dlqConfirm(w http.ResponseWriter, r *http.Request, se *session) {
	sel, ok := c.readSelection(w, r)
	if !ok {
		return
	}
	d := confirmData{Action: sel.action, Back: safeNext(r.PostFormValue("back")), Letters: sel.letters, Missing: sel.missing}
	if sel.action == ops.ActionRetry {
		d.Letters = ops.RetryOrder(d.Letters)
	}
	c.render(w, r, http.StatusOK, "confirm", se, d)
}

// dlqSelection is what a confirm or an act form asks for: the action, and
// the selected letters as they are now (and the sequences that hold
// nothing any more).
type dlqSelection struct {
	action  string
	seqs    []uint64
	letters []ops.Letter
	missing []uint64
}

// readSelection reads the form's action and selection and the letters;
// when it cannot, it has answered with the reason and reports false.
func (c *Console) readSelection(w http.ResponseWriter, r *http.Request) (dlqSelection, bool) {
	var sel dlqSelection
	var err error
	if sel.seqs, err = selected(r); err == nil {
		sel.action, err = dlqAction(r)
	}
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err.Error())
		return sel, false
	}
	if sel.letters, sel.missing, err = c.selectedLetters(r, sel.seqs); err != nil {
		c.fail(w, r, http.StatusServiceUnavailable, err.Error())
		return sel, false
	}
	return sel, true
}

// outcomeOf is what one action did to one letter.
type outcomeOf struct {
	Seq      uint64
	Worker   string
	Key      string
	OK       bool
	Message  string
	EventID  string
	Sequence uint64
}

type doneData struct {
	Done     int
	Action   string
	Results  []outcomeOf
	Refused  int
	Back     string
	Retried  bool
	Selected int
}

// dlqAct retries or removes the selected letters through ops, as
// `steward dlq retry` and `steward dlq rm` do (the same order, rate,
// refusals and audit lines and events).
func (c *Console) dlqAct(w http.ResponseWriter, r *http.Request, se *session) {
	sel, ok := c.readSelection(w, r)
	if !ok {
		return
	}
	action, letters, missing := sel.action, sel.letters, sel.missing
	var err error
	o := ops.ActOptions{Log: c.cfg.Log, Actor: "console", Now: c.cfg.Now}
	var rep *ops.Report
	if action == ops.ActionRetry {
		rep, err = ops.RetryLetters(r.Context(), c.cfg.JS, letters, ops.RetryOptions{ActOptions: o, Rate: ops.DefaultRetryRate})
	} else {
		rep, err = ops.RemoveLetters(r.Context(), c.cfg.JS, letters, o)
	}
	if rep == nil {
		c.fail(w, r, http.StatusServiceUnavailable, err.Error())
		return
	}
	d := doneData{Action: action, Back: safeNext(r.PostFormValue("back")), Retried: action == ops.ActionRetry, Selected: len(sel.seqs)}
	for _, seq := range missing {
		d.Results = append(d.Results, outcomeOf{Seq: seq, Message: fmt.Sprintf("gone: %s sequence %d holds nothing any more (retried or removed already)", events.StreamDLQ, seq)})
		d.Refused++
	}
	for _, res := range rep.Results {
		o := outcomeOf{Seq: res.Sequence, Worker: res.Worker, Key: res.Key, OK: res.OK(), EventID: res.EventID, Sequence: res.NewSequence}
		switch {
		case res.Result == ops.ResultRetried:
			o.Message = fmt.Sprintf("republished to %s at %s sequence %d", res.Subject, events.StreamEvents, res.NewSequence)
			if res.Already {
				o.Message += " (an earlier retry had stored it; the letter is removed now)"
			}
		case res.OK():
			o.Message = "removed from " + events.StreamDLQ
		default:
			o.Message = res.Result + ": " + res.Error
			d.Refused++
		}
		d.Results = append(d.Results, o)
	}
	if err != nil {
		d.Results = append(d.Results, outcomeOf{Message: redact.Secrets(err.Error())})
	}
	d.Done = rep.Done
	c.render(w, r, http.StatusOK, "done", se, d)
}
