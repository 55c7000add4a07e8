package publisher

import "testing"

// scopedTokens accepts one scoped token, as tokens.Dir would.
type scopedTokens map[string]string

func (s scopedTokens) Authenticate(token string) (Caller, bool) {
	name, ok := s[token]
	return Caller{Token: name, Scoped: true}, ok
}

// TestTokenCheck: the unscoped token is LegacyToken's caller, a scoped one
// its own name's, surrounding space is ignored, and anything else (or
// an empty unscoped token) is refused.
func TestTokenCheck(t *testing.T) {
	scoped := scopedTokens{"scoped-secret": "pipeline"}
	for _, tc := range []struct {
		name          string
		check         *TokenCheck
		token         string
		want          Caller
		authenticated bool
	}{
		{"unscoped", NewTokenCheck("s3cret", nil), "s3cret", Caller{Token: LegacyToken}, true},
		{"unscoped with spaces", NewTokenCheck(" s3cret\n", nil), "s3cret ", Caller{Token: LegacyToken}, true},
		{"wrong", NewTokenCheck("s3cret", scoped), "s3cre", Caller{}, false},
		{"scoped", NewTokenCheck("s3cret", scoped), "scoped-secret", Caller{Token: "pipeline", Scoped: true}, true},
		{"scoped only", NewTokenCheck("", scoped), "scoped-secret", Caller{Token: "pipeline", Scoped: true}, true},
		{"an empty unscoped token is none", NewTokenCheck("", scoped), "", Caller{}, false},
		{"no tokens", NewTokenCheck("", nil), "", Caller{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := tc.check.Authenticate(tc.token)
			if ok != tc.authenticated || got != tc.want {
				t.Fatalf("Authenticate(%q) = %+v, %v; want %+v, %v", tc.token, got, ok, tc.want, tc.authenticated)
			}
		})
	}
}
