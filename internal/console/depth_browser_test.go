package console_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers/converge"
	"github.com/steward-dev/steward/workers/credential"
	"github.com/steward-dev/steward/workers/workertest"
)

// publishRelease publishes release.published for version with its own id,
// so the same version published again is a new event.
func publishRelease(t *testing.T, r *rig, id, version string) {
	t.Helper()
	e, err := events.New(events.TypeReleasePublished, version, events.ReleasePublished{Version: version})
	if err != nil {
		t.Fatal(err)
	}
	e.SetID(id)
	workertest.Publish(t, r.js, e)
}

// TestBrowserDowngradeReason runs the real converge worker with its
// development registry (signed 1.1.0 and 1.2.0, installed 1.0.0):
// 1.1.0 and 1.2.0 apply, then 1.1.0 again is refused as a downgrade, and
// the key page says so in words (the verdict, the rule, the reason), not
// only in colour.
func TestBrowserDowngradeReason(t *testing.T) {
	r := newRig(t, nil)
	cfg, _, err := converge.Dev(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cw, err := converge.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	workertest.Start(t, r.js, cw.Spec(), cw)
	outcomes := func() int { return len(workertest.Outcomes(t, r.js, "converge", cfg.Install)) }
	publishRelease(t, r, "rel-1.1.0", "1.1.0")
	workertest.WaitUntil(t, "1.1.0 is settled", func() bool { return outcomes() == 1 })
	publishRelease(t, r, "rel-1.2.0", "1.2.0")
	workertest.WaitUntil(t, "1.2.0 is settled", func() bool { return outcomes() == 2 })
	publishRelease(t, r, "rel-1.1.0-again", "1.1.0")
	workertest.WaitUntil(t, "1.1.0 again is settled", func() bool { return outcomes() == 3 })

	ctx := browser(t)
	loginAs(t, ctx, r.url, testToken)
	row := `#history tr.entry-outcome:last-child`
	var verdicts []string
	var rule, reason string
	run(t, ctx, "the key page of 1.1.0",
		chromedp.Navigate(r.url+"/key?worker=converge&key=1.1.0"),
		chromedp.WaitVisible(chromedp.CSS(row+" .reason")),
		into(&verdicts, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#history tr.entry-outcome .verdict")].map(v => v.textContent.trim())`)),
		into(&rule, chromedp.Text(chromedp.CSS(row+" .rule"))),
		into(&reason, chromedp.Text(chromedp.CSS(row+" .reason"))),
	)
	if strings.Join(verdicts, ",") != "succeeded,refused" {
		t.Fatalf("the outcomes of 1.1.0 read %q; want succeeded, then refused", verdicts)
	}
	if rule != "downgrade" || !strings.Contains(reason, "1.1.0") || !strings.Contains(reason, "1.2.0") {
		t.Fatalf("the refusal reads rule %q, reason %q; want the downgrade from 1.2.0 named", rule, reason)
	}
	screenshot(t, ctx, "key-refused")
}

// TestBrowserPayloadView opens a rotation's payload from its key's
// history: the secret is elided (the ciphertext and the plaintext are
// nowhere on the page), the envelope reads verified by the controller key
// that signed it, and the outcome's causation links back to the event's
// row.
func TestBrowserPayloadView(t *testing.T) {
	r := newRig(t, nil)
	const plaintext = "payload-view-plaintext-5be1"
	id := r.rotationTraced(4, "client-4", plaintext, "")
	workertest.WaitUntil(t, "the rotation is applied", func() bool { return len(workertest.Outcomes(t, r.js, "credential", testHive)) == 1 })

	ctx := browser(t)
	loginAs(t, ctx, r.url, testToken)
	var data, verdict, body string
	run(t, ctx, "open the event's payload from the key page",
		chromedp.Navigate(r.url+"/key?worker=credential&key="+testHive),
		chromedp.WaitVisible(chromedp.CSS(`#event-`+id+` a.payload-link`)),
		chromedp.Click(chromedp.CSS(`#event-`+id+` a.payload-link`)),
		chromedp.WaitVisible(chromedp.CSS("#payload-data")),
		into(&data, chromedp.Text(chromedp.CSS("#payload-data"))),
		into(&verdict, chromedp.Text(chromedp.CSS("#envelope-verdict"))),
		into(&body, chromedp.Text(chromedp.CSS("body"))),
	)
	if !strings.Contains(data, `"secret": "[elided]"`) || !strings.Contains(data, `"clientId": "client-4"`) {
		t.Fatalf("the payload shows:\n%s", data)
	}
	if strings.Contains(body, "BEGIN AGE") || strings.Contains(body, plaintext) {
		t.Fatalf("the payload page shows the secret:\n%s", body)
	}
	keyID, err := signing.SignerKeyID(r.controller)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(verdict, "verified by the controller key") || !strings.Contains(verdict, keyID) {
		t.Fatalf("the envelope reads %q; want verified by the controller key %s", verdict, keyID)
	}
	screenshot(t, ctx, "payload")

	var hash string
	run(t, ctx, "the outcome's causation links to the event's row",
		chromedp.Navigate(r.url+"/key?worker=credential&key="+testHive),
		chromedp.WaitVisible(chromedp.CSS(`#history tr.entry-outcome a.causation-link`)),
		chromedp.Click(chromedp.CSS(`#history tr.entry-outcome a.causation-link`)),
		chromedp.Poll[chromedp.Void](`location.hash === "#event-`+id+`"`),
		into(&hash, chromedp.Evaluate[string](`location.hash`)),
	)
	var outcomeData string
	run(t, ctx, "the outcome's own payload",
		chromedp.Click(chromedp.CSS(`#history tr.entry-outcome a.payload-link`)),
		chromedp.WaitVisible(chromedp.CSS("#payload-data")),
		into(&outcomeData, chromedp.Text(chromedp.CSS("#attributes"))),
	)
	if !strings.Contains(outcomeData, id) {
		t.Fatalf("the outcome's payload does not name its cause %s:\n%s", id, outcomeData)
	}
}

// TestBrowserTraceLink: with --trace-url, the key page links the event's
// trace id to the trace UI, and the payload view does too.
func TestBrowserTraceLink(t *testing.T) {
	r := newRigWith(t, rigConfig{traceURL: "https://jaeger.example/trace/{traceId}"})
	const trace = "4bf92f3577b34da6a3ce929d0e0e4736"
	id := r.rotationTraced(2, "client-2", "traced", trace)
	ctx := browser(t)
	loginAs(t, ctx, r.url, testToken)
	var href, payloadHref string
	run(t, ctx, "the key page's trace link",
		chromedp.Navigate(r.url+"/key?worker=credential&key="+testHive),
		chromedp.WaitVisible(chromedp.CSS(`#event-`+id+` a.trace-link`)),
		into(&href, chromedp.Evaluate[string](`document.querySelector("#event-`+id+` a.trace-link").href`)),
		chromedp.Click(chromedp.CSS(`#event-`+id+` a.payload-link`)),
		chromedp.WaitVisible(chromedp.CSS("#trace a.trace-link")),
		into(&payloadHref, chromedp.Evaluate[string](`document.querySelector("#trace a.trace-link").href`)),
	)
	want := "https://jaeger.example/trace/" + trace
	if href != want || payloadHref != want {
		t.Fatalf("trace links %q and %q; want %q", href, payloadHref, want)
	}
}

// TestBrowserKeySearch lists the credential worker's keys and narrows
// them by prefix; a key opens its history.
func TestBrowserKeySearch(t *testing.T) {
	r := newRig(t, nil)
	r.rotation(1, "client-1", "one")
	for _, hive := range []string{"hive-22", "other-3"} {
		workertest.PublishData(t, r.js, events.TypeCredentialRotated, hive, events.CredentialRotated{Hive: hive, Version: 1, ClientID: "c", Secret: "-----BEGIN AGE ENCRYPTED FILE-----\nYQ==\n-----END AGE ENCRYPTED FILE-----"})
	}
	ctx := browser(t)
	loginAs(t, ctx, r.url, testToken)
	keys := func() []string {
		var got []string
		run(t, ctx, "read the keys", into(&got, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#keys tr.key-row")].map(r => r.dataset.key)`)))
		return got
	}
	run(t, ctx, "every key of credential",
		chromedp.Navigate(r.url+"/keys?worker=credential"),
		chromedp.WaitVisible(chromedp.CSS("#keys")),
	)
	if got := strings.Join(keys(), " "); got != "hive-1 hive-22 other-3" {
		t.Fatalf("every key: %q", got)
	}
	run(t, ctx, "search by prefix",
		chromedp.SendKeys(chromedp.CSS("#keys-prefix"), "hive-"),
		chromedp.Click(chromedp.CSS("#keys-submit")),
		chromedp.WaitVisible(chromedp.CSS(`#keys[data-prefix="hive-"]`)),
	)
	if got := strings.Join(keys(), " "); got != "hive-1 hive-22" {
		t.Fatalf("keys starting with hive-: %q", got)
	}
	screenshot(t, ctx, "keys")
	run(t, ctx, "a key opens its history",
		chromedp.Click(chromedp.CSS(`#keys tr[data-key="hive-22"] a.key`)),
		chromedp.WaitVisible(chromedp.CSS("#history tr.entry-event")),
	)
}

// TestBrowserOverviewCharts: the overview's charts are drawn before any
// event (no bar), and once events are stored and settled the live refresh
// draws them: bars of what was stored and settled this minute, and a
// backlog line.
func TestBrowserOverviewCharts(t *testing.T) {
	r := newRig(t, nil)
	ctx := browser(t)
	loginAs(t, ctx, r.url, testToken)
	var bars, points int
	run(t, ctx, "the charts with nothing stored",
		chromedp.WaitVisible(chromedp.CSS("#chart-rate")),
		into(&bars, chromedp.Evaluate[int](`document.querySelectorAll("#chart-rate rect").length`)),
		into(&points, chromedp.Evaluate[int](`Number(document.querySelector("#chart-backlog").dataset.points)`)),
	)
	if bars != 0 || points != 60 {
		t.Fatalf("before any event: %d bars, %d backlog points; want none and 60", bars, points)
	}
	for v := 1; v <= 3; v++ {
		r.rotation(v, "client", "s")
	}
	workertest.WaitUntil(t, "the rotations are settled", func() bool { return len(workertest.Outcomes(t, r.js, "credential", testHive)) == 3 })
	var stored, settled string
	run(t, ctx, "the live refresh draws them",
		chromedp.WaitVisible(chromedp.CSS("#chart-rate rect.bar-settled")),
		chromedp.WaitVisible(chromedp.CSS("#chart-backlog polyline.line")),
		into(&stored, chromedp.Evaluate[string](`[...document.querySelectorAll("#chart-rate rect.bar-stored title")].map(t => t.textContent).join("; ")`)),
		into(&settled, chromedp.Evaluate[string](`[...document.querySelectorAll("#chart-rate rect.bar-settled title")].map(t => t.textContent).join("; ")`)),
	)
	if !strings.Contains(stored, ": 3 stored") || !strings.Contains(settled, ": 3 settled") {
		t.Fatalf("the bars read %q and %q; want 3 stored and 3 settled in this minute", stored, settled)
	}
	// Paused, the instance leaves what comes next pending: the backlog.
	if _, err := ops.Pause(context.Background(), r.js, nil, credential.Name, testHive, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	r.rotation(4, "client", "s")
	r.rotation(5, "client", "s")
	var now string
	run(t, ctx, "the backlog line rises",
		chromedp.WaitVisible(chromedp.CSS(`#chart-backlog[data-last="2"]`)),
		into(&now, chromedp.Text(chromedp.CSS("#chart-backlog .now"))),
	)
	if now != "2" {
		t.Fatalf("the backlog chart says now %q; want 2", now)
	}
	screenshot(t, ctx, "overview")
}
