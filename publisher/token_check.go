package publisher

import (
	"crypto/sha256"
	"crypto/subtle"
	"strings"
)

// TokenCheck is the one check of a bearer token that the ingress and the
// console's login share: the unscoped token (IngressConfig.Token) and the
// scoped ones (Tokens), so that the two never accept different tokens.
type TokenCheck struct {
	legacy bool
	hash   [sha256.Size]byte
	scoped Tokens
}

// NewTokenCheck accepts token (the unscoped one; empty accepts none) and
// whatever scoped authenticates (nil: none).
func NewTokenCheck(token string, scoped Tokens) *TokenCheck {
	token = strings.TrimSpace(token)
	return &TokenCheck{legacy: token != "", hash: sha256.Sum256([]byte(token)), scoped: scoped}
}

// Authenticate implements Tokens: the caller token is, with via as the
// caller's Via, and false when it is neither the unscoped token nor a
// current scoped one. It compares in constant time (hashing first makes it
// constant in the length too), and asks the scoped tokens whatever the
// unscoped comparison found, so the time taken does not tell which kind of
// token matched.
func (c *TokenCheck) Authenticate(token string) (Caller, bool) {
	got := sha256.Sum256([]byte(strings.TrimSpace(token)))
	legacy := c.legacy && subtle.ConstantTimeCompare(got[:], c.hash[:]) == 1
	if c.scoped != nil {
		if caller, ok := c.scoped.Authenticate(token); ok && !legacy {
			return caller, true
		}
	}
	if legacy {
		return Caller{Token: LegacyToken}, true
	}
	return Caller{}, false
}
