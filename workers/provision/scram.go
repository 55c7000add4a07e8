package provision

import (
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// SCRAM-SHA-256 (RFC 5802, RFC 7677) as PostgreSQL stores it in
// pg_authid.rolpassword:
//
//	SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>
//
// with standard base64. Steward computes the verifier itself, as psql's
// \password does, so the server only ever sees the verifier.
const (
	scramPrefix = "SCRAM-SHA-256"
	// PostgreSQL's defaults (scram_iterations, SCRAM_DEFAULT_SALT_LEN).
	scramIterations = 4096
	scramSaltLen    = 16
	// A verifier set by hand with more iterations than this is treated as
	// not matching (and rewritten) rather than spending minutes on it.
	scramMaxIterations = 1 << 20
)

// verifierPattern is everything a verifier may hold: the mechanism name,
// digits, base64, '$' and ':'. No quote or backslash can pass it, which is
// what makes it safe as a string literal.
var verifierPattern = regexp.MustCompile(`^SCRAM-SHA-256\$[1-9][0-9]*:[A-Za-z0-9+/]+=*\$[A-Za-z0-9+/]+=*:[A-Za-z0-9+/]+=*$`)

// newVerifier returns a fresh verifier (new random salt) for password.
func newVerifier(password string) (string, error) {
	salt := make([]byte, scramSaltLen)
	if _, err := rand.Read(salt); err != nil {
		return "", fmt.Errorf("salt for a SCRAM verifier: %w", err)
	}
	return scramVerifier(password, salt, scramIterations)
}

// scramVerifier computes the verifier of password for salt and iterations.
// The password is used as it is: Steward admits printable ASCII only, for
// which SASLprep (applied by the server and by libpq) changes nothing.
func scramVerifier(password string, salt []byte, iterations int) (string, error) {
	storedKey, serverKey, err := scramKeys(password, salt, iterations)
	if err != nil {
		return "", err
	}
	b64 := base64.StdEncoding.EncodeToString
	return scramPrefix + "$" + strconv.Itoa(iterations) + ":" + b64(salt) + "$" + b64(storedKey) + ":" + b64(serverKey), nil
}

func scramKeys(password string, salt []byte, iterations int) (storedKey, serverKey []byte, err error) {
	salted, err := pbkdf2.Key(sha256.New, password, salt, iterations, sha256.Size)
	if err != nil {
		return nil, nil, fmt.Errorf("SCRAM salted password: %w", err)
	}
	clientKey := hmacSHA256(salted, "Client Key")
	sum := sha256.Sum256(clientKey)
	return sum[:], hmacSHA256(salted, "Server Key"), nil
}

func hmacSHA256(key []byte, msg string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}

// verifier is a parsed SCRAM-SHA-256 verifier.
type verifier struct {
	iterations           int
	salt                 []byte
	storedKey, serverKey []byte
}

// parseVerifier reads what the server stores. ok is false for anything
// else: NULL, an md5 hash, a plaintext password, a malformed verifier.
func parseVerifier(s string) (v verifier, ok bool) {
	if !verifierPattern.MatchString(s) {
		return v, false
	}
	rest := strings.TrimPrefix(s, scramPrefix+"$")
	params, keys, _ := strings.Cut(rest, "$")
	iter, salt, _ := strings.Cut(params, ":")
	stored, server, _ := strings.Cut(keys, ":")
	n, err := strconv.Atoi(iter)
	if err != nil || n < 1 {
		return v, false
	}
	dec := base64.StdEncoding.DecodeString
	v.iterations = n
	var e1, e2, e3 error
	v.salt, e1 = dec(salt)
	v.storedKey, e2 = dec(stored)
	v.serverKey, e3 = dec(server)
	if e1 != nil || e2 != nil || e3 != nil || len(v.salt) == 0 || len(v.storedKey) != sha256.Size || len(v.serverKey) != sha256.Size {
		return verifier{}, false
	}
	return v, true
}

// verifierMatches reports whether stored (pg_authid.rolpassword) is a
// SCRAM-SHA-256 verifier of password, recomputed with its own salt and
// iterations.
func verifierMatches(stored, password string) bool {
	v, ok := parseVerifier(stored)
	if !ok || v.iterations > scramMaxIterations {
		return false
	}
	storedKey, serverKey, err := scramKeys(password, v.salt, v.iterations)
	if err != nil {
		return false
	}
	return subtle.ConstantTimeCompare(storedKey, v.storedKey) == 1 &&
		subtle.ConstantTimeCompare(serverKey, v.serverKey) == 1
}

// verifierLiteral quotes a verifier as an SQL string literal. ALTER ROLE
// ... PASSWORD takes no parameters, so the literal is built here; the
// pattern check guarantees it holds no quote or backslash.
func verifierLiteral(v string) (string, error) {
	if !verifierPattern.MatchString(v) {
		return "", fmt.Errorf("a computed SCRAM verifier does not match %s, so it was not sent to the server", verifierPattern)
	}
	return "'" + v + "'", nil
}
