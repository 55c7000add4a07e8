package console

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// Login attempts are limited per client address: the token is long and
// random, but a console reachable by many must not be a place to try
// tokens at line rate.
const (
	// LoginAttempts is how many logins a client address may try in
	// LoginWindow; the next is refused (429) until the oldest is a window
	// old.
	LoginAttempts = 5
	LoginWindow   = time.Minute
	// loginClients bounds the addresses remembered. When that many have
	// tried within a window, a new address is refused too: memory stays
	// bounded, at the price of locking out newcomers while a flood from
	// many addresses lasts.
	loginClients = 10_000
)

// loginLimiter counts login attempts per client address.
type loginLimiter struct {
	mu  sync.Mutex
	now func() time.Time
	m   map[string][]time.Time
}

func newLoginLimiter(now func() time.Time) *loginLimiter {
	return &loginLimiter{now: now, m: map[string][]time.Time{}}
}

// clientAddress is the address a request came from, without its port.
// Behind a reverse proxy that is the proxy's: every client then shares one
// allowance. X-Forwarded-For is not read, since any client can set it.
func clientAddress(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// allow counts an attempt from addr and says whether it may go ahead; if
// not, retryAfter is when the next one may.
func (l *loginLimiter) allow(addr string) (ok bool, retryAfter time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	recent := l.recent(addr, now)
	if len(recent) == 0 && len(l.m) >= loginClients {
		for k := range l.m {
			if len(l.recent(k, now)) == 0 {
				delete(l.m, k)
			}
		}
		if len(l.m) >= loginClients {
			return false, LoginWindow
		}
	}
	if len(recent) >= LoginAttempts {
		return false, recent[0].Add(LoginWindow).Sub(now)
	}
	l.m[addr] = append(recent, now)
	return true, 0
}

// recent are addr's attempts within the window before now; it forgets
// the older ones.
func (l *loginLimiter) recent(addr string, now time.Time) []time.Time {
	ts := l.m[addr]
	i := 0
	for i < len(ts) && !ts[i].After(now.Add(-LoginWindow)) {
		i++
	}
	if i == len(ts) {
		delete(l.m, addr)
		return nil
	}
	ts = ts[i:]
	l.m[addr] = ts
	return ts
}
