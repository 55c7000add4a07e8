package publisher_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers/workertest"
)

const testToken = "s3cret-ingress-token"

type ingressEnv struct {
	js  jetstream.JetStream
	url string
}

func startIngress(t *testing.T, maxBody int64) ingressEnv {
	t.Helper()
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	in, err := publisher.NewIngress(publisher.New(js), publisher.IngressConfig{Token: testToken, MaxBody: maxBody})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(in)
	t.Cleanup(hs.Close)
	return ingressEnv{js: js, url: hs.URL + publisher.IngressPath}
}

// post sends body with headers and returns the status and decoded response.
func post(t *testing.T, url string, header map[string]string, body string) (int, publisher.IngressResponse, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var out publisher.IngressResponse
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("status %d: response is not JSON: %v: %s", resp.StatusCode, err, raw)
	}
	return resp.StatusCode, out, resp.Header
}

func eventsStored(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	s, err := js.Stream(context.Background(), events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func binaryHeaders(typ, id, subject string) map[string]string {
	return map[string]string{
		"Authorization":  "Bearer " + testToken,
		"Ce-Specversion": "1.0",
		"Ce-Type":        typ,
		"Ce-Source":      "/console/test",
		"Ce-Id":          id,
		"Ce-Subject":     subject,
		"Content-Type":   "application/json",
	}
}

func structured(id, version string) string {
	return `{"specversion":"1.0","type":"` + events.TypeReleasePublished + `","source":"/console/test","id":"` + id +
		`","subject":"` + version + `","datacontenttype":"application/json","data":{"version":"` + version + `"}}`
}

func withAuth(h map[string]string) map[string]string {
	h["Authorization"] = "Bearer " + testToken
	return h
}

// TestIngressBinary proves a binary-mode event (ce-* headers) is stored and
// answered with 202, its id, sequence and duplicate flag, and that the same
// id sent again is reported as a duplicate and stored once.
func TestIngressBinary(t *testing.T) {
	env := startIngress(t, 0)
	h := binaryHeaders(events.TypeReleasePublished, "rel-1", "1.2.3")
	status, resp, _ := post(t, env.url, h, `{"version":"1.2.3"}`)
	if status != http.StatusAccepted || len(resp.Events) != 1 {
		t.Fatalf("status %d, response %+v", status, resp)
	}
	got := resp.Events[0]
	if got.ID != "rel-1" || got.Sequence != 1 || got.Duplicate || got.Stream != events.StreamEvents {
		t.Fatalf("ack %+v", got)
	}
	status, resp, _ = post(t, env.url, h, `{"version":"1.2.3"}`)
	if status != http.StatusAccepted || !resp.Events[0].Duplicate || resp.Events[0].Sequence != 1 {
		t.Fatalf("resend: status %d, response %+v", status, resp)
	}
	if n := eventsStored(t, env.js); n != 1 {
		t.Fatalf("%d events stored, want 1", n)
	}
}

// TestIngressStructured proves a structured-mode event is stored as it was
// sent: the stored message decodes to the same id, type, key and data.
func TestIngressStructured(t *testing.T) {
	env := startIngress(t, 0)
	status, resp, _ := post(t, env.url, withAuth(map[string]string{"Content-Type": "application/cloudevents+json"}), structured("rel-s", "2.0.0"))
	if status != http.StatusAccepted || len(resp.Events) != 1 || resp.Events[0].ID != "rel-s" {
		t.Fatalf("status %d, response %+v", status, resp)
	}
	s, err := env.js.Stream(context.Background(), events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := s.GetMsg(context.Background(), resp.Events[0].Sequence)
	if err != nil {
		t.Fatal(err)
	}
	e, err := events.Decode(raw.Header, raw.Data)
	if err != nil {
		t.Fatal(err)
	}
	if e.ID() != "rel-s" || e.Type() != events.TypeReleasePublished || e.Subject() != "2.0.0" || string(e.Data()) != `{"version":"2.0.0"}` {
		t.Fatalf("stored %v", e)
	}
	if raw.Subject != "steward.events.release.published" {
		t.Fatalf("stored on %s", raw.Subject)
	}
}

// TestIngressBatch proves a batch is stored whole, in order, with one
// result per event.
func TestIngressBatch(t *testing.T) {
	env := startIngress(t, 0)
	body := "[" + structured("b-1", "1.0.0") + "," + structured("b-2", "1.0.1") + "," + structured("b-3", "1.1.0") + "]"
	status, resp, _ := post(t, env.url, withAuth(map[string]string{"Content-Type": "application/cloudevents-batch+json"}), body)
	if status != http.StatusAccepted || len(resp.Events) != 3 {
		t.Fatalf("status %d, response %+v", status, resp)
	}
	for i, want := range []string{"b-1", "b-2", "b-3"} {
		if resp.Events[i].ID != want || resp.Events[i].Sequence != uint64(i+1) {
			t.Fatalf("event %d: %+v", i, resp.Events[i])
		}
	}
}

// TestIngressRefusesBadEvents proves every kind of bad input gets a 400
// that names what is wrong, and that nothing is stored.
func TestIngressRefusesBadEvents(t *testing.T) {
	env := startIngress(t, 0)
	cases := []struct {
		name   string
		header map[string]string
		body   string
		want   []string
	}{
		{"bad JSON", withAuth(map[string]string{"Content-Type": "application/cloudevents+json"}), `{"specversion":"1.0",`, []string{"not a CloudEvent"}},
		{"not a CloudEvent", withAuth(map[string]string{"Content-Type": "application/json"}), `{"version":"1.0.0"}`, []string{"ce-specversion"}},
		{"unknown type", binaryHeaders("dev.steward.nothing.v1", "u-1", "x"), `{"version":"1.0.0"}`, []string{"dev.steward.nothing.v1", "not a Steward event type"}},
		{"schema: unknown field", binaryHeaders(events.TypeReleasePublished, "s-1", "1.0.0"), `{"version":"1.0.0","image":"evil"}`, []string{"image"}},
		{"schema: bad version", binaryHeaders(events.TypeReleasePublished, "s-2", "1.0"), `{"version":"1.0"}`, []string{"/version", "pattern"}},
		{"schema: wrong type", binaryHeaders(events.TypeCredentialRotated, "s-3", "h1"), `{"hive":"h1","version":"one","clientId":"c","secret":"x"}`, []string{"/version"}},
		{"key with a wildcard", binaryHeaders(events.TypeCredentialRotated, "k-1", "h.*"), `{"hive":"h.*","version":1,"clientId":"c","secret":"x"}`, []string{"hive"}},
		{"subject differs from the data's key", binaryHeaders(events.TypeReleasePublished, "k-2", "9.9.9"), `{"version":"1.0.0"}`, []string{"subject", "9.9.9"}},
		{"missing attribute", map[string]string{"Authorization": "Bearer " + testToken, "Ce-Specversion": "1.0", "Ce-Source": "/c", "Ce-Id": "m-1", "Content-Type": "application/json"}, `{"version":"1.0.0"}`, []string{"type"}},
		{"empty batch", withAuth(map[string]string{"Content-Type": "application/cloudevents-batch+json"}), `[]`, []string{"no events"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, resp, _ := post(t, env.url, c.header, c.body)
			if status != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %+v", status, resp)
			}
			t.Log(resp.Error)
			for _, w := range c.want {
				if !strings.Contains(resp.Error, w) {
					t.Fatalf("error %q does not name %q", resp.Error, w)
				}
			}
		})
	}
	if n := eventsStored(t, env.js); n != 0 {
		t.Fatalf("%d events stored after refusals", n)
	}
}

// TestIngressBatchWithOneBadEventStoresNothing proves a batch is checked
// whole before anything is published, and that the refusal names the event.
func TestIngressBatchWithOneBadEventStoresNothing(t *testing.T) {
	env := startIngress(t, 0)
	bad := `{"specversion":"1.0","type":"` + events.TypeReleasePublished + `","source":"/c","id":"b-bad","datacontenttype":"application/json","data":{"version":"1.0.0","extra":1}}`
	body := "[" + structured("b-1", "1.0.0") + "," + bad + "," + structured("b-3", "1.1.0") + "]"
	status, resp, _ := post(t, env.url, withAuth(map[string]string{"Content-Type": "application/cloudevents-batch+json"}), body)
	if status != http.StatusBadRequest {
		t.Fatalf("status %d: %+v", status, resp)
	}
	for _, w := range []string{"event 1 of 3", "b-bad", "extra"} {
		if !strings.Contains(resp.Error, w) {
			t.Fatalf("error %q does not name %q", resp.Error, w)
		}
	}
	if len(resp.Events) != 0 {
		t.Fatalf("results %+v for a refused batch", resp.Events)
	}
	if n := eventsStored(t, env.js); n != 0 {
		t.Fatalf("%d events stored from a refused batch", n)
	}
}

// TestIngressToken proves a request without the token, with another token
// or with another scheme is refused with 401 and a WWW-Authenticate
// challenge, and stores nothing; the error never echoes the token.
func TestIngressToken(t *testing.T) {
	env := startIngress(t, 0)
	for name, auth := range map[string]string{
		"missing":      "",
		"wrong":        "Bearer " + testToken + "x",
		"prefix":       "Bearer " + testToken[:5],
		"basic scheme": "Basic " + testToken,
	} {
		t.Run(name, func(t *testing.T) {
			h := binaryHeaders(events.TypeReleasePublished, "t-1", "1.0.0")
			delete(h, "Authorization")
			if auth != "" {
				h["Authorization"] = auth
			}
			status, resp, header := post(t, env.url, h, `{"version":"1.0.0"}`)
			if status != http.StatusUnauthorized {
				t.Fatalf("status %d, want 401", status)
			}
			if !strings.HasPrefix(header.Get("WWW-Authenticate"), "Bearer") {
				t.Fatalf("WWW-Authenticate %q", header.Get("WWW-Authenticate"))
			}
			if strings.Contains(resp.Error, testToken[:5]) {
				t.Fatalf("error %q echoes the token", resp.Error)
			}
		})
	}
	if n := eventsStored(t, env.js); n != 0 {
		t.Fatalf("%d events stored without the token", n)
	}
}

// TestIngressBodyLimit proves an oversized body is refused with 413, both
// when its Content-Length says so and when it is streamed without one.
func TestIngressBodyLimit(t *testing.T) {
	env := startIngress(t, 256)
	big := `{"version":"1.0.0","manifestDigest":"` + strings.Repeat("a", 400) + `"}`
	status, resp, _ := post(t, env.url, binaryHeaders(events.TypeReleasePublished, "big-1", "1.0.0"), big)
	if status != http.StatusRequestEntityTooLarge || !strings.Contains(resp.Error, "256") {
		t.Fatalf("status %d, response %+v", status, resp)
	}

	req, err := http.NewRequest(http.MethodPost, env.url, io.MultiReader(strings.NewReader(big)))
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = -1 // chunked: the limit is found while reading
	for k, v := range binaryHeaders(events.TypeReleasePublished, "big-2", "1.0.0") {
		req.Header.Set(k, v)
	}
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked: status %d", r.StatusCode)
	}
	if n := eventsStored(t, env.js); n != 0 {
		t.Fatalf("%d events stored from oversized bodies", n)
	}
}

// TestIngressMethodAndPath proves only POST /events is served.
func TestIngressMethodAndPath(t *testing.T) {
	env := startIngress(t, 0)
	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
		req, err := http.NewRequest(m, env.url, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+testToken)
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != http.StatusMethodNotAllowed || r.Header.Get("Allow") != http.MethodPost {
			t.Fatalf("%s: status %d, Allow %q", m, r.StatusCode, r.Header.Get("Allow"))
		}
	}
	status, _, _ := post(t, strings.TrimSuffix(env.url, publisher.IngressPath)+"/other", withAuth(map[string]string{}), "")
	if status != http.StatusNotFound {
		t.Fatalf("other path: status %d", status)
	}
}

// TestIngressNATSDown proves an event NATS cannot store is answered with
// 503 and Retry-After, not lost behind a 202.
func TestIngressNATSDown(t *testing.T) {
	srv := workertest.StartServer(t)
	srv.JetStream(t) // streams
	nc, err := nats.Connect(srv.URL(), nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	in, err := publisher.NewIngress(publisher.New(js), publisher.IngressConfig{Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(in)
	defer hs.Close()
	srv.Shutdown()
	srv.WaitForShutdown()
	status, resp, header := post(t, hs.URL+publisher.IngressPath, binaryHeaders(events.TypeReleasePublished, "down-1", "1.0.0"), `{"version":"1.0.0"}`)
	if status != http.StatusServiceUnavailable || header.Get("Retry-After") == "" || !strings.Contains(resp.Error, "down-1") {
		t.Fatalf("status %d, Retry-After %q, response %+v", status, header.Get("Retry-After"), resp)
	}
}

// TestIngressNeedsToken proves an ingress is never built open.
func TestIngressNeedsToken(t *testing.T) {
	if _, err := publisher.NewIngress(nil, publisher.IngressConfig{Token: "  "}); err == nil || !strings.Contains(err.Error(), "token") {
		t.Fatalf("err %v", err)
	}
}

// rawRequest is a request as an attacker writes it on a raw connection.
func rawRequest(extra string, contentLength int) string {
	return "POST " + publisher.IngressPath + " HTTP/1.1\r\nHost: ingress\r\nContent-Type: application/json\r\nCe-Specversion: 1.0\r\n" +
		extra + "Content-Length: " + strconv.Itoa(contentLength) + "\r\n\r\n"
}

// closedByServer reports whether the server has closed c (a read ends in
// EOF or a reset) within the deadline, draining whatever it answered.
func closedByServer(c net.Conn, within time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(within))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// TestIngress401DoesNotReadTheBody is finding 12.7 on one connection: a
// client without the token announces a body and never sends it. Today the
// ingress answers 401 and then keeps the connection to read (and discard)
// the body, so the client holds it for free for as long as it likes. The
// 401 must say Connection: close and the server must close at once.
func TestIngress401DoesNotReadTheBody(t *testing.T) {
	env := startIngress(t, 0)
	c, err := net.Dial("tcp", strings.TrimPrefix(strings.TrimSuffix(env.url, publisher.IngressPath), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, rawRequest("", 1000)); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(workertest.DefaultTimeout))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
		t.Fatalf("status %d, Connection: close %v", resp.StatusCode, resp.Close)
	}
	if !closedByServer(c, 5*time.Second) {
		t.Fatal("the server kept the unauthenticated connection open, waiting for its body")
	}
}

// hardened runs the ingress in a publisher.Server with short limits.
func hardened(t *testing.T, cfg publisher.ServerConfig) (jetstream.JetStream, *publisher.Server) {
	t.Helper()
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	in, err := publisher.NewIngress(publisher.New(js), publisher.IngressConfig{Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	hs, err := publisher.NewServer("127.0.0.1:0", in, cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- hs.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return js, hs
}

// TestIngressHeldConnectionsDoNotLockOut is finding 12.7 as the attack:
// unauthenticated clients open many connections and hold them (headers
// never finished, a body trickled, an idle keep-alive after a request),
// three times the connection limit. A console must still get its event
// stored, and every held connection must be closed by the server.
func TestIngressHeldConnectionsDoNotLockOut(t *testing.T) {
	const limit = 6
	_, hs := hardened(t, publisher.ServerConfig{
		ReadHeaderTimeout: 300 * time.Millisecond, ReadTimeout: 600 * time.Millisecond,
		WriteTimeout: 5 * time.Second, IdleTimeout: 300 * time.Millisecond, MaxConns: limit,
	})
	addr := hs.Addr()
	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	hold := func(first string) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		_, _ = io.WriteString(c, first)
	}
	auth := "Authorization: Bearer " + testToken + "\r\n"
	for range limit {
		// Headers begun and never finished.
		hold("POST /events HTTP/1.1\r\nHost: ingress\r\n")
		// A body announced and never sent, with the token.
		hold(rawRequest(auth, 4096))
		// A request answered, then the connection kept idle.
		hold("GET /events HTTP/1.1\r\nHost: ingress\r\n" + auth + "\r\n")
	}
	client := &http.Client{Timeout: 5 * time.Second}
	workertest.WaitUntil(t, "a console's event is stored despite the held connections", func() bool {
		req, _ := http.NewRequest(http.MethodPost, hs.URL()+publisher.IngressPath, strings.NewReader(`{"version":"3.0.0"}`))
		for k, v := range binaryHeaders(events.TypeReleasePublished, "console-1", "3.0.0") {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusAccepted
	})
	for i, c := range held {
		if !closedByServer(c, 10*time.Second) {
			t.Fatalf("held connection %d is still open", i)
		}
	}
}

// TestIngressTLS proves --tls-cert and --tls-key serve HTTPS, and that a
// certificate without its key is refused at start.
func TestIngressTLS(t *testing.T) {
	dir := t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ingress"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := publisher.NewServer("127.0.0.1:0", http.NotFoundHandler(), publisher.ServerConfig{CertFile: certFile}); err == nil {
		t.Fatal("a certificate without a key was accepted")
	}
	js, hs := hardened(t, publisher.ServerConfig{CertFile: certFile, KeyFile: keyFile})
	if !strings.HasPrefix(hs.URL(), "https://") {
		t.Fatalf("URL %s", hs.URL())
	}
	pool := x509.NewCertPool()
	pool.AddCert(&x509.Certificate{Raw: der})
	parsed, _ := x509.ParseCertificate(der)
	pool.AddCert(parsed)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	req, _ := http.NewRequest(http.MethodPost, hs.URL()+publisher.IngressPath, strings.NewReader(`{"version":"4.0.0"}`))
	for k, v := range binaryHeaders(events.TypeReleasePublished, "tls-1", "4.0.0") {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted || eventsStored(t, js) != 1 {
		t.Fatalf("status %d over TLS", resp.StatusCode)
	}
	if resp, err := http.Post("http://"+hs.Addr()+publisher.IngressPath, "application/json", strings.NewReader("{}")); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusAccepted {
			t.Fatal("plain HTTP accepted on the TLS port")
		}
	}
}

// TestIngressSchemaErrorNeverQuotesSecret is finding 12.6 at the ingress:
// a console pastes a plaintext secret into a rotation; the 400 and the
// ingress log name the field and never the value.
func TestIngressSchemaErrorNeverQuotesSecret(t *testing.T) {
	const plain = "plaintext-Pa55-pasted-here"
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	var logs bytes.Buffer
	in, err := publisher.NewIngress(publisher.New(js), publisher.IngressConfig{Token: testToken, Log: zerolog.New(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(in)
	defer hs.Close()
	status, resp, _ := post(t, hs.URL+publisher.IngressPath, binaryHeaders(events.TypeCredentialRotated, "rot-1", "h1"),
		`{"hive":"h1","version":1,"clientId":"c","secret":"`+plain+`"}`)
	if status != http.StatusBadRequest || !strings.Contains(resp.Error, "/secret") {
		t.Fatalf("status %d, error %q", status, resp.Error)
	}
	if strings.Contains(resp.Error, plain) || strings.Contains(logs.String(), plain) {
		t.Fatalf("the secret is quoted: response %q, log %s", resp.Error, logs.String())
	}
}
