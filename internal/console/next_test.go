package console_test

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestLoginNextCannotLeaveTheConsole is the open-redirect attack: a link to
// the console's login whose next sends the operator, once logged in, to a
// host the attacker runs. Browsers drop tabs and newlines from a Location
// and read a backslash as a slash, so each of these is another host to
// them; the console must send every one to "/" and keep its own paths.
func TestLoginNextCannotLeaveTheConsole(t *testing.T) {
	r := newRig(t, nil)
	attacks := []string{
		"/\t/evil.example", "/\n/evil.example", "/\r/evil.example", "//evil", "/\\evil", "/\\/evil",
		"https://x", "http://evil.example/", "javascript:alert(1)", "/\x00/evil", "/\x7f/evil", "/ok\x1b[2J",
		"/\u0085/evil", "evil.example", "/%2F/evil.example",
	}
	// The Location is read off the wire (RoundTrip), as a browser gets
	// it: http.Client refuses to parse some of these and would hide what
	// the console sent.
	send := func(req *http.Request) *http.Response {
		t.Helper()
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	// The login itself (attempts are rate limited, so one is posted; the
	// rest go through the logged-in redirect below, which is the same rule).
	form := url.Values{"token": {testToken}, "next": {attacks[0]}}
	req, _ := http.NewRequest("POST", r.url+"/login", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp := send(req)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" || len(resp.Cookies()) != 1 {
		t.Fatalf("login with next %q: %s to %q; want 303 to / with the session cookie (only a console path is followed)", attacks[0], resp.Status, resp.Header.Get("Location"))
	}
	cookie := resp.Cookies()[0]
	// A logged-in operator sent to /login?next= is redirected at once.
	get := func(next string) *http.Response {
		req, _ := http.NewRequest("GET", r.url+"/login?next="+url.QueryEscape(next), nil)
		req.AddCookie(cookie)
		return send(req)
	}
	for _, next := range attacks {
		resp := get(next)
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
			t.Errorf("GET /login?next=%q logged in: %s to %q; want 303 to /", next, resp.Status, resp.Header.Get("Location"))
		}
	}
	// What the console links to itself is kept.
	const own = "/key?worker=credential&key=hive-1"
	if resp := get(own); resp.Header.Get("Location") != own {
		t.Errorf("login with next %q went to %q; want that page", own, resp.Header.Get("Location"))
	}
}
