package console_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/workers/credential"
	"github.com/steward-dev/steward/workers/workertest"
)

// Browser tests drive Debian's Chromium headless (apt-get install
// chromium; .ci/run installs it) against the console in process. Where no
// Chromium is installed they skip, and under CI they fail
// (workertest.Requires). STEWARD_CONSOLE_SCREENSHOTS=<dir> saves
// a screenshot of each page they reach there (docs/screenshots/console-*.png).

func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	workertest.Requires(t, "Chromium (apt-get install chromium)", errors.New("no chromium, chromium-browser or google-chrome on PATH"))
	return ""
}

// browser starts a headless Chromium with a fresh profile. The flags keep
// it off the network it would otherwise reach for (updates, sync, QUIC),
// which on a closed network makes it hang.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1440, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	ctx, cancelTime := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(func() { cancelTime(); cancelTab(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start Chromium: %v", err)
	}
	return ctx
}

// run runs the steps, and on failure says where the page was and what
// it showed.
func run(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		loc, _ := chromedp.Run(sctx, chromedp.Location())
		html, _ := chromedp.Run(sctx, chromedp.OuterHTML(chromedp.CSS("main")))
		t.Fatalf("%s: %v\nat %s:\n%s", what, err, loc, html)
	}
}

// into runs an action that returns a value and keeps the value in p.
func into[T any](p *T, a chromedp.Action[T]) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		v, err := a(ctx, tg)
		*p = v
		return chromedp.Void{}, err
	}
}

func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("STEWARD_CONSOLE_SCREENSHOTS")
	if dir == "" {
		return
	}
	var png []byte
	run(t, ctx, "screenshot "+name, into(&png, chromedp.FullScreenshot(100)))
	if err := os.WriteFile(filepath.Join(dir, "console-"+name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

func loginAs(t *testing.T, ctx context.Context, base, token string) {
	t.Helper()
	run(t, ctx, "log in",
		chromedp.Navigate(base+"/"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), token),
		chromedp.Click(chromedp.CSS("#login-submit")),
		chromedp.WaitVisible(chromedp.CSS("#instances")),
	)
}

func TestBrowserLogin(t *testing.T) {
	r := newRig(t, nil)
	ctx := browser(t)
	var msg string
	run(t, ctx, "a wrong token",
		chromedp.Navigate(r.url+"/dlq"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), "not-the-token"),
		chromedp.Click(chromedp.CSS("#login-submit")),
		chromedp.WaitVisible(chromedp.CSS("#login-error")),
		into(&msg, chromedp.Text(chromedp.CSS("#login-error"))),
	)
	if !strings.Contains(msg, "not a token this console accepts") {
		t.Fatalf("a wrong token: the page says %q", msg)
	}
	cookies := cookiesOf(t, ctx)
	if len(cookies) != 0 {
		t.Fatalf("a wrong token left cookies: %+v", cookies)
	}
	run(t, ctx, "still refused", chromedp.Navigate(r.url+"/dlq"), chromedp.WaitVisible(chromedp.CSS("#token")))
	screenshot(t, ctx, "login")

	// The right token, from a page asked for before: back to that page.
	run(t, ctx, "the right token",
		chromedp.SendKeys(chromedp.CSS("#token"), testToken),
		chromedp.Click(chromedp.CSS("#login-submit")),
		chromedp.WaitVisible(chromedp.CSS("#letters")),
	)
	cookies = cookiesOf(t, ctx)
	if len(cookies) != 1 || !cookies[0].HTTPOnly || cookies[0].SameSite != network.CookieSameSiteStrict {
		t.Fatalf("session cookie %+v: want one, HttpOnly, SameSite=Strict", cookies)
	}
	// Logging out ends the session.
	run(t, ctx, "log out",
		chromedp.Click(chromedp.CSS("header .logout button")),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.Navigate(r.url+"/"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
	)
}

// request is one request the page sent, as DevTools saw it leave.
type request struct {
	url, method, headers, body string
	bodyMissing                bool
}

// capture records every request the browser sends, through the DevTools
// protocol's Network domain (requestWillBeSent carries the URL, headers and
// body of each, fetches and form posts alike).
func capture(t *testing.T, ctx context.Context) func() []request {
	t.Helper()
	var mu sync.Mutex
	var got []request
	err := chromedp.Listen(ctx, func(ev any) {
		e, ok := ev.(*network.EventRequestWillBeSent)
		if !ok {
			return
		}
		rq := request{url: e.Request.URL + e.Request.URLFragment, method: e.Request.Method}
		for k, v := range e.Request.Headers {
			rq.headers += k + ": " + strings.TrimSpace(strings.ReplaceAll(stringOf(v), "\n", " ")) + "\n"
		}
		for _, p := range e.Request.PostDataEntries {
			rq.body += string(p.Bytes)
		}
		rq.bodyMissing = e.Request.HasPostData && len(e.Request.PostDataEntries) == 0
		mu.Lock()
		got = append(got, rq)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatalf("enable the network domain: %v", err)
	}
	return func() []request {
		mu.Lock()
		defer mu.Unlock()
		return append([]request(nil), got...)
	}
}

func cookiesOf(t *testing.T, ctx context.Context) []*network.Cookie {
	t.Helper()
	res, err := chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{})
	if err != nil {
		t.Fatalf("read the cookies: %v", err)
	}
	return res.Cookies
}

func stringOf(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return ""
}

// TestBrowserPublishRotation publishes a credential rotation through the
// form: the page seals the secret with age to the hive's recipient, the
// server (with the rig's controller key as its Signer) publishes
// it, the real credential worker applies it, and the key page follows the
// event to its credential.applied outcome. Every request the page sent is
// captured through DevTools, and none holds the plaintext.
func TestBrowserPublishRotation(t *testing.T) {
	signer := &TestSigner{}
	r := newRig(t, signer)
	ctx := browser(t)
	requests := capture(t, ctx)
	const plaintext = "s3cret-plaintext-never-sent-7f3a"
	loginAs(t, ctx, r.url, testToken)
	run(t, ctx, "fill the rotation form",
		chromedp.Navigate(r.url+"/publish?type=dev.steward.credential.rotated.v1"),
		chromedp.WaitVisible(chromedp.CSS("#field-hive")),
		chromedp.SendKeys(chromedp.CSS("#recipient"), r.recipient),
		chromedp.SendKeys(chromedp.CSS("#field-hive"), testHive),
		chromedp.SendKeys(chromedp.CSS("#field-version"), "3"),
		chromedp.SendKeys(chromedp.CSS("#field-clientId"), "client-3"),
		chromedp.SendKeys(chromedp.CSS("#field-secret"), plaintext),
	)
	screenshot(t, ctx, "publish")

	// The page's own checks come first: a version below the schema's
	// minimum is refused in the page, and nothing is sent.
	before := len(requests())
	var problems string
	run(t, ctx, "a version the schema refuses",
		chromedp.SetValue(chromedp.CSS("#field-version"), "0"),
		chromedp.Click(chromedp.CSS("#publish-submit")),
		chromedp.WaitVisible(chromedp.CSS("#problems")),
		into(&problems, chromedp.Text(chromedp.CSS("#problems"))),
	)
	if !strings.Contains(problems, "/version: must be at least 1") {
		t.Fatalf("the page's problems: %q", problems)
	}
	for _, rq := range requests()[before:] {
		if strings.Contains(rq.url, "/api/publish") {
			t.Fatalf("an invalid form was sent: %+v", rq)
		}
	}

	var outcome string
	run(t, ctx, "publish and follow the event to its outcome",
		chromedp.SetValue(chromedp.CSS("#field-version"), "3"),
		chromedp.Click(chromedp.CSS("#publish-submit")),
		chromedp.WaitVisible(chromedp.CSS("#follow")),
		chromedp.WaitVisible(chromedp.CSS("#follow-outcome")),
		into(&outcome, chromedp.Text(chromedp.CSS("#follow-outcome"))),
	)
	if outcome != "dev.steward.credential.applied.v1" {
		t.Fatalf("the key page says the outcome is %q; want dev.steward.credential.applied.v1", outcome)
	}
	var rows int
	run(t, ctx, "the history", into(&rows, chromedp.Evaluate[int](`document.querySelectorAll("#history tr.followed").length`)))
	if rows < 2 {
		t.Fatalf("the key page highlights %d entries of the followed event; want its event and its outcome", rows)
	}
	screenshot(t, ctx, "key-followed")
	if got, err := os.ReadFile(filepath.Join(r.credDir, credential.SecretFile)); err != nil || string(got) != plaintext {
		t.Fatalf("the hive's secret file after the rotation: %q, %v", got, err)
	}
	if signer.calls.Load() != 1 {
		t.Fatalf("the signer was called %d times; want once", signer.calls.Load())
	}

	// The proof: the plaintext is in no request the page sent (URL,
	// headers or body), and the publish request did carry the ciphertext.
	sawPublish := false
	for _, rq := range requests() {
		if rq.bodyMissing {
			t.Fatalf("DevTools omitted the body of %s %s, so it cannot be checked", rq.method, rq.url)
		}
		for _, part := range []string{rq.url, rq.headers, rq.body} {
			if strings.Contains(part, plaintext) {
				t.Fatalf("the plaintext left the page in %s %s", rq.method, rq.url)
			}
		}
		if strings.HasSuffix(rq.url, "/api/publish") {
			sawPublish = true
			if !strings.Contains(rq.body, `-----BEGIN AGE ENCRYPTED FILE-----`) {
				t.Fatalf("the publish request holds no age ciphertext: %q", rq.body)
			}
		}
	}
	if !sawPublish {
		t.Fatal("no publish request was captured: the check above proved nothing")
	}
}

// TestBrowserRedriveDeadLetter makes a real dead letter (the handler
// panics, as a bug would, and the runtime dead-letters the rotation), fixes
// the handler, and redrives the letter from the dead-letter page: the
// confirmation says how many, and the key page shows the event applied.
func TestBrowserRedriveDeadLetter(t *testing.T) {
	r := newRig(t, nil)
	r.broken.Store(true)
	r.rotation(5, "client-5", "redriven-secret")
	workertest.WaitUntil(t, "the rotation is dead-lettered", func() bool {
		return len(workertest.DeadLetters(t, r.js, credential.Name, testHive)) == 1
	})
	r.broken.Store(false)

	ctx := browser(t)
	loginAs(t, ctx, r.url, testToken)
	var reason string
	run(t, ctx, "the dead-letter page",
		chromedp.Navigate(r.url+"/dlq?worker=credential&type=dev.steward.credential.rotated.v1&reason=panic"),
		chromedp.WaitVisible(chromedp.CSS(`#letters input[name=seq]`)),
		into(&reason, chromedp.Text(chromedp.CSS(`#letters td.reason`))),
	)
	if !strings.Contains(reason, "panic") {
		t.Fatalf("the letter's reason: %q", reason)
	}
	screenshot(t, ctx, "dlq")
	var question, summary string
	run(t, ctx, "retry it, confirming",
		chromedp.Click(chromedp.CSS(`#letters input[name=seq]`)),
		chromedp.Click(chromedp.CSS("#retry-selected")),
		chromedp.WaitVisible(chromedp.CSS("#confirm-question")),
		into(&question, chromedp.Text(chromedp.CSS("#confirm-question"))),
	)
	if question != "Retry 1 dead letter?" {
		t.Fatalf("the confirmation asks %q", question)
	}
	run(t, ctx, "confirm",
		chromedp.Click(chromedp.CSS("#confirm")),
		chromedp.WaitVisible(chromedp.CSS("#done-summary")),
		into(&summary, chromedp.Text(chromedp.CSS("#done-summary"))),
	)
	if summary != "Retried 1 of 1" {
		results, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#results")))
		t.Fatalf("after the retry: %q: %s", summary, results)
	}
	var outcome string
	run(t, ctx, "follow the redriven event",
		chromedp.Click(chromedp.CSS("#results a.key")),
		chromedp.WaitVisible(chromedp.CSS("#follow-outcome")),
		into(&outcome, chromedp.Text(chromedp.CSS("#follow-outcome"))),
	)
	if outcome != "dev.steward.credential.applied.v1" {
		t.Fatalf("the redriven event's outcome: %q", outcome)
	}
	if n := len(workertest.DeadLetters(t, r.js, credential.Name, testHive)); n != 0 {
		t.Fatalf("%d dead letters left after the retry", n)
	}
	var left string
	run(t, ctx, "the dead-letter page again",
		chromedp.Navigate(r.url+"/dlq"),
		chromedp.WaitVisible(chromedp.CSS("#dlq-count")),
		into(&left, chromedp.Text(chromedp.CSS("#dlq-count"))),
	)
	if left != "0" {
		t.Fatalf("the dead-letter page lists %s letters after the retry", left)
	}
}

// TestBrowserOverviewShowsPaused pauses the credential instance from the
// overview (through ops.Pause, as `steward pause` does) and sees it shown
// paused; then resumes it behind the page's back and sees the live refresh
// pick that up.
func TestBrowserOverviewShowsPaused(t *testing.T) {
	r := newRig(t, nil)
	r.rotation(1, "client-1", "first")
	workertest.WaitIdle(t, r.js, r.worker.ConsumerName())
	ctx := browser(t)
	loginAs(t, ctx, r.url, testToken)
	row := "#instance-credential-" + testHive
	var paused string
	run(t, ctx, "pause from the overview",
		chromedp.WaitVisible(chromedp.CSS(row)),
		chromedp.Click(chromedp.CSS(row+" button.pause")),
		chromedp.WaitVisible(chromedp.CSS(row+`[data-state="paused"]`)),
		into(&paused, chromedp.Text(chromedp.CSS(row+" td.paused"))),
	)
	if !strings.HasPrefix(paused, "until ") {
		t.Fatalf("the paused cell says %q", paused)
	}
	screenshot(t, ctx, "overview-paused")
	st, err := ops.GetStatus(context.Background(), r.js, ops.StatusOptions{Instance: testHive})
	if err != nil || len(st.Instances) != 1 || st.Instances[0].State != ops.StatePaused {
		t.Fatalf("ops.GetStatus disagrees with the page: %+v, %v", st, err)
	}
	if _, err := ops.Resume(context.Background(), r.js, nil, credential.Name, testHive); err != nil {
		t.Fatal(err)
	}
	run(t, ctx, "the live refresh shows it resumed",
		chromedp.WaitVisible(chromedp.CSS(row+`:not([data-state="paused"])`)),
	)
}
