package console

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/steward-dev/steward/publisher"
)

// cookieName is the session cookie. The __Host- prefix (which would pin
// it to Secure and Path=/) is only possible over HTTPS, and dev serves
// plain HTTP on 127.0.0.1, so the attributes are set by hand instead.
const cookieName = "steward_console"

// session is one login. Only the hash of its id is kept, so a dump of the
// process's memory does not hold cookies that work.
type session struct {
	csrf    string
	expires time.Time
	// caller is who logged in: the Signer judges each publish by it, so
	// a token revoked after the login publishes nothing signed.
	caller publisher.Caller
}

type sessions struct {
	mu  sync.Mutex
	ttl time.Duration
	now func() time.Time
	m   map[[sha256.Size]byte]*session
}

func newSessions(ttl time.Duration, now func() time.Time) *sessions {
	return &sessions{ttl: ttl, now: now, m: map[[sha256.Size]byte]*session{}}
}

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24)
	return base64.RawURLEncoding.EncodeToString(b)
}

// create starts a session and returns its id (the cookie's value).
func (s *sessions) create(caller publisher.Caller) (string, *session) {
	id := randomToken()
	se := &session{csrf: randomToken(), expires: s.now().Add(s.ttl), caller: caller}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Expired sessions go on every login, so the map stays bounded by
	// the logins of one TTL.
	for k, v := range s.m {
		if !s.now().Before(v.expires) {
			delete(s.m, k)
		}
	}
	s.m[sha256.Sum256([]byte(id))] = se
	return id, se
}

func (s *sessions) get(id string) *session {
	if id == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := sha256.Sum256([]byte(id))
	se, ok := s.m[k]
	if !ok {
		return nil
	}
	if !s.now().Before(se.expires) {
		delete(s.m, k)
		return nil
	}
	return se
}

func (s *sessions) remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, sha256.Sum256([]byte(id)))
}

// sessionOf is the request's session, or nil.
func (c *Console) sessionOf(r *http.Request) *session {
	ck, err := r.Cookie(cookieName)
	if err != nil {
		return nil
	}
	return c.sessions.get(ck.Value)
}

func (c *Console) setCookie(w http.ResponseWriter, r *http.Request, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name:     cookieName,
		Value:    value,
		Path:     "/",
		MaxAge:   maxAge,
		HttpOnly: true,
		Secure:   r.TLS != nil,
		SameSite: http.SameSiteStrictMode,
	})
}

// authenticate checks a login attempt with the ingress's own token check,
// so a login is exactly a token the ingress takes.
func (c *Console) authenticate(token string) (publisher.Caller, bool) {
	caller, ok := c.tokens.Authenticate(token)
	if ok {
		caller.Via = "console"
	}
	return caller, ok
}

// authed wraps a handler that needs a login. A page asked for without one
// is sent to the login page (and back after it); anything else is 401.
// Requests that change state must also carry the session's CSRF token, in
// the form field csrf or the X-CSRF-Token header.
func (c *Console) authed(h func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		se := c.sessionOf(r)
		if se == nil {
			if r.Method == http.MethodGet && !strings.HasPrefix(r.URL.Path, "/api/") && r.Header.Get("X-Console-Fetch") == "" {
				http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			c.fail(w, r, http.StatusUnauthorized, "not logged in, or the session has ended: log in again with the ingress token at /login")
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			sent := r.Header.Get("X-CSRF-Token")
			if sent == "" {
				sent = r.PostFormValue("csrf")
			}
			if subtle.ConstantTimeCompare([]byte(sent), []byte(se.csrf)) != 1 {
				c.fail(w, r, http.StatusForbidden, "refused: the form is stale or did not come from this console (its CSRF token does not match the session). Reload the page and try again.")
				return
			}
		}
		h(w, r, se)
	}
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	if c.sessionOf(r) != nil {
		http.Redirect(w, r, safeNext(r.URL.Query().Get("next")), http.StatusSeeOther)
		return
	}
	c.render(w, r, http.StatusOK, "login", nil, map[string]any{"Next": safeNext(r.URL.Query().Get("next"))})
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	next := safeNext(r.PostFormValue("next"))
	// Limited before the token is looked at, so a refused attempt says
	// nothing about the token.
	if ok, after := c.logins.allow(clientAddress(r)); !ok {
		secs := int(after.Round(time.Second) / time.Second)
		if secs < 1 {
			secs = 1
		}
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		c.cfg.Log.Warn().Str("remote", r.RemoteAddr).Msg("console login refused: too many attempts from this address")
		c.render(w, r, http.StatusTooManyRequests, "login", nil, map[string]any{
			"Next":  next,
			"Error": fmt.Sprintf("Too many login attempts from this address (%d a minute at most). Wait %d seconds, then log in with the ingress token.", LoginAttempts, secs),
		})
		return
	}
	caller, ok := c.authenticate(r.PostFormValue("token"))
	if !ok {
		c.cfg.Log.Warn().Str("remote", r.RemoteAddr).Msg("console login refused: not the ingress token")
		c.render(w, r, http.StatusUnauthorized, "login", nil, map[string]any{
			"Next":  next,
			"Error": "That is not a token this console accepts. The console's login is the ingress token (steward serve --token-file, or <dir>/ingress-token for steward dev) or a scoped token the operator issued (steward token issue) that is not revoked or expired.",
		})
		return
	}
	id, _ := c.sessions.create(caller)
	c.setCookie(w, r, id, int(c.cfg.SessionTTL/time.Second))
	c.cfg.Log.Info().Str("remote", r.RemoteAddr).Str("token", caller.Token).Msg("console login")
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request, _ *session) {
	if ck, err := r.Cookie(cookieName); err == nil {
		c.sessions.remove(ck.Value)
	}
	c.setCookie(w, r, "", -1)
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// safeNext keeps a redirect after login (or after an action) on this
// console: only a path of it, otherwise "/". A browser resolves a
// Location header leniently (it drops tabs and newlines, reads a backslash
// as a slash), so "/\t/evil.example" becomes "//evil.example", another
// host; hence any control character or backslash is refused outright, and
// what is left must parse as a path with no scheme, no host and no
// opaque part.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/login") {
		return "/"
	}
	for _, c := range next {
		if c < 0x20 || c == 0x7f || c == '\\' || (c >= 0x80 && c < 0xa0) {
			return "/"
		}
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.Opaque != "" || u.User != nil || !strings.HasPrefix(u.Path, "/") || strings.HasPrefix(u.Path, "//") {
		return "/"
	}
	return next
}
