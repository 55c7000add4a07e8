package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/console"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// noRedirect is a client that shows redirects instead of following them.
func noRedirect(jar http.CookieJar) *http.Client {
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// login logs a client in and returns it with its CSRF token.
func login(t *testing.T, base string) (*http.Client, string) {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := noRedirect(jar)
	resp, err := c.PostForm(base+"/login", url.Values{"token": {testToken}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login: %s", resp.Status)
	}
	resp, err = c.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	i := strings.Index(string(body), `name="csrf-token" content="`)
	if i < 0 {
		t.Fatalf("no csrf token on the overview:\n%s", body)
	}
	rest := string(body)[i+len(`name="csrf-token" content="`):]
	return c, rest[:strings.IndexByte(rest, '"')]
}

func TestNoPageOrAPIWithoutLogin(t *testing.T) {
	r := newRig(t, nil)
	c := noRedirect(nil)
	for _, p := range []string{"/", "/overview/live", "/key?worker=credential&key=hive-1", "/key/live?worker=credential&key=hive-1",
		"/dlq", "/dlq/1", "/keys", "/keys?worker=credential&prefix=h", "/payload/STEWARD_EVENTS/1", "/publish", "/publish?type=" + events.TypeReleasePublished, "/static/console.js", "/static/vendor/age.js", "/nothing-here"} {
		resp, err := c.Get(r.url + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/login") {
			t.Errorf("GET %s without a login: %s, Location %q; want 303 to /login", p, resp.Status, resp.Header.Get("Location"))
		}
	}
	for _, p := range []string{"/pause", "/dlq/confirm", "/dlq/act", "/api/publish", "/logout"} {
		resp, err := c.Post(r.url+p, "application/x-www-form-urlencoded", strings.NewReader("seq=1&action=remove"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("POST %s without a login: %s; want 401", p, resp.Status)
		}
	}
	// A live fragment asked for by the page's script is 401, not a redirect.
	req, _ := http.NewRequest("GET", r.url+"/overview/live", nil)
	req.Header.Set("X-Console-Fetch", "1")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("live fragment without a login: %s; want 401", resp.Status)
	}
}

func TestLoginSetsAStrictHttpOnlyCookieAndRefusesAWrongToken(t *testing.T) {
	r := newRig(t, nil)
	c := noRedirect(nil)
	resp, err := c.PostForm(r.url+"/login", url.Values{"token": {"not-the-token"}})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 || !strings.Contains(string(body), "not a token this console accepts") {
		t.Fatalf("wrong token: %s, cookies %v", resp.Status, resp.Cookies())
	}
	resp, err = c.PostForm(r.url+"/login", url.Values{"token": {testToken}, "next": {"//evil.example/"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
		t.Fatalf("login: %s to %q; want 303 to / (never another host)", resp.Status, resp.Header.Get("Location"))
	}
	cks := resp.Cookies()
	if len(cks) != 1 || !cks[0].HttpOnly || cks[0].SameSite != http.SameSiteStrictMode || cks[0].Path != "/" || strings.Contains(cks[0].Value, testToken) {
		t.Fatalf("session cookie %+v: want one, HttpOnly, SameSite=Strict, Path=/, not the token", cks)
	}
}

func TestStateChangesNeedTheCSRFTokenAndTheSameOrigin(t *testing.T) {
	r := newRig(t, nil)
	c, csrf := login(t, r.url)
	form := url.Values{"worker": {"credential"}, "instance": {testHive}, "for": {"1h"}, "action": {"pause"}}
	resp, err := c.PostForm(r.url+"/pause", form)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("pause without the CSRF token: %s; want 403", resp.Status)
	}
	form.Set("csrf", csrf)
	req, _ := http.NewRequest("POST", r.url+"/pause", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err = c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("cross-site pause with the token: %s; want 403", resp.Status)
	}
	resp, err = c.PostForm(r.url+"/pause", form)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("pause with the CSRF token: %s; want 303", resp.Status)
	}
}

func TestSignedTypesCannotBePublishedWithoutASigner(t *testing.T) {
	r := newRig(t, nil)
	c, csrf := login(t, r.url)
	for _, typ := range console.SignedTypes {
		resp, err := c.Get(r.url + "/publish?type=" + typ)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), `id="cannot-publish"`) || strings.Contains(string(body), `id="publish"`) {
			t.Errorf("the %s form without a signer does not say it cannot be published:\n%s", typ, body)
		}
		data := `{"hive":"hive-1","version":1,"clientId":"c","secret":"-----BEGIN AGE ENCRYPTED FILE-----\nx\n-----END AGE ENCRYPTED FILE-----\n"}`
		if typ == events.TypeGrantChanged {
			data = `{"machine":"m1","requirement":"postgres","generation":1,"given":[]}`
		}
		req, _ := http.NewRequest("POST", r.url+"/api/publish", strings.NewReader(`{"type":"`+typ+`","data":`+data+`}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-CSRF-Token", csrf)
		resp, err = c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var out console.PublishResponse
		_ = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(out.Error, "cannot be published from here") {
			t.Errorf("publishing %s without a signer: %s %q; want 403 saying why", typ, resp.Status, out.Error)
		}
	}
	// A type that needs no signature is published, and followed.
	req, _ := http.NewRequest("POST", r.url+"/api/publish", strings.NewReader(`{"type":"`+events.TypeReleasePublished+`","data":{"version":"1.2.3"}}`))
	req.Header.Set("X-CSRF-Token", csrf)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var out console.PublishResponse
	_ = json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted || out.Sequence == 0 || !strings.HasPrefix(out.Follow, "/key?") {
		t.Fatalf("publish a release: %s %+v", resp.Status, out)
	}
}

func TestElideData(t *testing.T) {
	data := `{"hive":"h","secret":"hunter2-plaintext","given":[{"secret":"p4ss"}],"note":"-----BEGIN AGE ENCRYPTED FILE-----\nYWdl\n-----END AGE ENCRYPTED FILE-----","id":"AGE-SECRET-KEY-1QQQQ"}`
	got := ops.ElideData([]byte(data), false)
	for _, leak := range []string{"hunter2", "p4ss", "YWdl", "AGE-SECRET-KEY-1QQQQ"} {
		if strings.Contains(got, leak) {
			t.Errorf("ElideData left %q in:\n%s", leak, got)
		}
	}
	if !strings.Contains(got, `"hive": "h"`) {
		t.Errorf("ElideData lost what is not secret:\n%s", got)
	}
	if got := ops.ElideData([]byte(`not json, AGE-SECRET-KEY-1ABC`), false); strings.Contains(got, "AGE-SECRET-KEY-1ABC") {
		t.Errorf("ElideData of non-JSON: %s", got)
	}
}

// TestConsoleLoginIsRateLimitedPerAddress: after LoginAttempts tries in a
// minute the next is refused with 429 and Retry-After before the token is
// looked at (the right token too), and a minute later it is let through.
func TestConsoleLoginIsRateLimitedPerAddress(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 1, 2, 15, 4, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	r := newRigAt(t, nil, clock)
	c := noRedirect(nil)
	try := func(token string) *http.Response {
		resp, err := c.PostForm(r.url+"/login", url.Values{"token": {token}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for i := range console.LoginAttempts {
		if resp := try("wrong"); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("attempt %d: %s; want 401", i+1, resp.Status)
		}
	}
	resp := try(testToken)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "60" || len(resp.Cookies()) != 0 {
		t.Fatalf("attempt %d with the right token: %s, Retry-After %q; want 429 and no session", console.LoginAttempts+1, resp.Status, resp.Header.Get("Retry-After"))
	}
	mu.Lock()
	now = now.Add(console.LoginWindow + time.Second)
	mu.Unlock()
	if resp := try(testToken); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("a minute later: %s; want 303", resp.Status)
	}
}

// TestConsoleDeadLetterFilterAndRemove: the dead-letter page filters
// through ops (worker, key, reason) and a removal from it removes exactly
// the letters chosen, leaving the audit events ops writes.
func TestConsoleDeadLetterFilterAndRemove(t *testing.T) {
	r := newRig(t, nil)
	var seqs []uint64
	for _, l := range []struct{ hive, reason string }{{"h1", "read-only folder"}, {"h2", "read-only folder"}, {"h1", "unknown field"}} {
		seqs = append(seqs, forgeLetter(t, r, l.hive, l.reason))
	}
	c, csrf := login(t, r.url)
	body := get(t, c, r.url+"/dlq?worker=credential-"+testHive+"&reason=READ-ONLY&key=h1")
	if n := strings.Count(body, `<tr data-seq=`); n != 1 || !strings.Contains(body, fmt.Sprintf(`data-seq="%d"`, seqs[0])) {
		t.Fatalf("the filtered page lists %d letters:\n%s", n, body)
	}
	if !strings.Contains(get(t, c, r.url+"/dlq?since=2000-01-01&until=2000-01-02"), `<span id="dlq-count">0</span>`) {
		t.Fatal("a time range before every letter lists some")
	}
	form := url.Values{"csrf": {csrf}, "action": {"remove"}, "seq": {fmt.Sprint(seqs[0]), fmt.Sprint(seqs[2])}}
	resp, err := c.PostForm(r.url+"/dlq/act", form)
	if err != nil {
		t.Fatal(err)
	}
	done, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(done), "Removed 2 of 2") {
		t.Fatalf("remove: %s\n%s", resp.Status, done)
	}
	left, err := ops.ListLetters(context.Background(), r.js, ops.LetterFilter{}, ops.Proofs{})
	if err != nil || len(left.Letters) != 1 || left.Letters[0].Sequence != seqs[1] {
		t.Fatalf("left after the removal: %+v, %v", left, err)
	}
}

// TestConsoleKeyPageShowsCheckpoints: after the real credential worker
// applies a rotation, the key page shows the instance's checkpoint.
func TestConsoleKeyPageShowsCheckpoints(t *testing.T) {
	r := newRig(t, nil)
	r.rotation(1, "client-1", "first")
	workertest.WaitIdle(t, r.js, r.worker.ConsumerName())
	c, _ := login(t, r.url)
	body := get(t, c, r.url+"/key?worker=credential&key="+testHive)
	if !strings.Contains(body, `id="checkpoints"`) || !strings.Contains(body, `<td class="applied">1</td>`) {
		t.Fatalf("the key page shows no checkpoint:\n%s", body)
	}
}

// TestConsoleKeyPageSaysWhy: a superseded rotation, a refused one and a
// dead-lettered one are told apart on the key page in words and classes,
// each with its reason, the refusal with its rule, and the superseded one
// links to the entry of the event that superseded it.
func TestConsoleKeyPageSaysWhy(t *testing.T) {
	r := newRig(t, nil)
	// With the worker stopped, versions 1 and 2 are stored together, so
	// 1 is superseded by 2 whether or not 2 reached the lane before 1 ran:
	// 2 is the newest event stored on the key's subject. Were the unsigned
	// 3 stored with them, it would be the newest and, unranked, supersede
	// nothing, and 1 would be superseded only if 2 had reached the lane
	// first. So 3 comes once they settle, and is refused.
	if err := r.worker.Stop(); err != nil {
		t.Fatal(err)
	}
	r.rotation(1, "client-1", "first")
	r.rotation(2, "client-2", "second")
	r.worker = workertest.Start(t, r.js, r.spec, r.handler, workers.WithMaxPanics(1), workers.WithLogger(zerolog.Nop()))
	workertest.WaitIdle(t, r.js, r.worker.ConsumerName())
	workertest.PublishData(t, r.js, events.TypeCredentialRotated, testHive, events.CredentialRotated{Hive: testHive, Version: 3, ClientID: "client-3", Secret: "-----BEGIN AGE ENCRYPTED FILE-----\nx\n-----END AGE ENCRYPTED FILE-----\n"})
	workertest.WaitIdle(t, r.js, r.worker.ConsumerName())
	r.broken.Store(true)
	r.rotation(4, "client-4", "fourth")
	workertest.WaitUntil(t, "the rotation is dead-lettered", func() bool { return len(workertest.DeadLetters(t, r.js, "credential", testHive)) == 1 })

	h, err := ops.GetHistory(context.Background(), r.js, ops.HistoryOptions{Worker: "credential", Key: testHive})
	if err != nil {
		t.Fatal(err)
	}
	var by, rule string
	for _, e := range h.Entries {
		if e.Outcome == "superseded" {
			by = e.SupersededBy
		}
		if e.Outcome == "refused" {
			rule = e.Rule
		}
	}
	if by == "" || rule == "" {
		t.Fatalf("no superseded outcome naming its successor, or no refusal naming its rule: %+v", h.Entries)
	}
	c, _ := login(t, r.url)
	body := get(t, c, r.url+"/key?worker=credential&key="+testHive)
	for _, want := range []string{
		`<span class="verdict verdict-superseded">superseded</span>`,
		`<span class="verdict verdict-refused">refused</span>`,
		`<span class="verdict verdict-dead-lettered">dead-lettered</span>`,
		`<b class="rule">` + rule + `</b>: `,
		`superseded by ` + by,
		`<a class="superseded-by" href="#event-` + by + `">`,
		`<tr id="event-` + by + `"`,
		"panic",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the key page lacks %s:\n%s", want, body)
		}
	}
}

func get(t *testing.T, c *http.Client, u string) string {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s\n%s", u, resp.Status, b)
	}
	return string(b)
}

// forgeLetter writes a dead letter of the credential instance for hive,
// as the runtime writes one.
func forgeLetter(t *testing.T, r *rig, hive, reason string) uint64 {
	t.Helper()
	e, err := events.New(events.TypeCredentialRotated, hive, events.CredentialRotated{Hive: hive, Version: 1, ClientID: "c", Secret: "-----BEGIN AGE ENCRYPTED FILE-----\nx\n-----END AGE ENCRYPTED FILE-----\n"})
	if err != nil {
		t.Fatal(err)
	}
	e.SetID("rot-" + hive + "-" + strings.ReplaceAll(reason, " ", "-"))
	e.SetSource("/test")
	e.SetTime(time.Now().UTC())
	orig, err := events.Encode("steward.events.credential.rotated."+hive, e)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := events.NewDeadLetter(events.LetterSource{Consumer: "credential-" + testHive, DLQSubject: events.DLQSubject("credential", testHive),
		Stream: events.StreamEvents, Sequence: 1, Subject: orig.Subject, Delivered: 1, Reason: reason, Header: orig.Header, Data: orig.Data})
	ack, err := r.js.PublishMsg(context.Background(), msg)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// TestConsolePayloadAddresses: a payload is read only from the events and
// outcomes streams, by a sequence; a dead letter's goes to its own page,
// and anything else is refused saying why.
func TestConsolePayloadAddresses(t *testing.T) {
	r := newRig(t, nil)
	r.rotation(1, "client-1", "payload-addresses")
	c, _ := login(t, r.url)
	for _, tc := range []struct {
		path   string
		status int
		says   string
	}{
		{"/payload/STEWARD_EVENTS/1", http.StatusOK, `secret&#34;: &#34;[elided]`},
		{"/payload/STEWARD_EVENTS/99", http.StatusNotFound, "holds no message at sequence 99"},
		{"/payload/STEWARD_EVENTS/x", http.StatusBadRequest, "is not a stream sequence"},
		{"/payload/KV_STEWARD_CHECKPOINTS/1", http.StatusNotFound, "a payload is read from STEWARD_EVENTS or STEWARD_OUTCOMES"},
		{"/payload/STEWARD_DLQ/3", http.StatusSeeOther, ""},
	} {
		resp, err := c.Get(r.url + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.says) {
			t.Errorf("GET %s: %s, want %d saying %q:\n%.600s", tc.path, resp.Status, tc.status, tc.says, b)
		}
		if tc.status == http.StatusSeeOther && resp.Header.Get("Location") != "/dlq/3" {
			t.Errorf("GET %s: to %q, want /dlq/3", tc.path, resp.Header.Get("Location"))
		}
		if found := leaks(string(b)); len(found) > 0 || strings.Contains(string(b), "payload-addresses") {
			t.Errorf("GET %s shows a secret: %q", tc.path, found)
		}
	}
}

// TestConsoleLetterShowsTheEnvelope: a dead-lettered rotation's page says
// what its envelope proves, as the payload view does.
func TestConsoleLetterShowsTheEnvelope(t *testing.T) {
	r := newRig(t, nil)
	r.broken.Store(true)
	r.rotation(7, "client-7", "letter-envelope")
	var letters []events.DeadLetter
	workertest.WaitUntil(t, "the rotation is dead-lettered", func() bool {
		letters = workertest.DeadLetters(t, r.js, "credential", testHive)
		return len(letters) == 1
	})
	c, _ := login(t, r.url)
	page := get(t, c, fmt.Sprintf("%s/dlq/%d", r.url, letters[0].DLQSequence))
	if !strings.Contains(page, `id="envelope-verdict"><span class="verdict verdict-applied">verified</span> by the controller key`) {
		t.Fatalf("the letter page does not say the envelope verified:\n%s", page)
	}
	if found := leaks(page); len(found) > 0 || strings.Contains(page, "letter-envelope") {
		t.Fatalf("the letter page shows a secret: %q", found)
	}
}
