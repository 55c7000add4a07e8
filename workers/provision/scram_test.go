package provision

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestVerifierRFC7677 checks the keys against the example exchange of RFC
// 7677 (user "user", password "pencil"): the ServerKey of our verifier
// signs the exchange as the RFC's server did, and the StoredKey accepts the
// RFC client's proof the way a server checks it.
func TestVerifierRFC7677(t *testing.T) {
	salt, _ := base64.StdEncoding.DecodeString("W22ZaJ0SNY7soEsUEjb6gQ==")
	v, err := scramVerifier("pencil", salt, 4096)
	if err != nil {
		t.Fatal(err)
	}
	pv, ok := parseVerifier(v)
	if !ok {
		t.Fatalf("our own verifier does not parse: %s", v)
	}
	authMessage := "n=user,r=rOprNGfwEbeRWgbNEkqO," +
		"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096," +
		"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
	if got := base64.StdEncoding.EncodeToString(hmacSHA256(pv.serverKey, authMessage)); got != "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=" {
		t.Fatalf("server signature %s differs from RFC 7677's", got)
	}
	proof, _ := base64.StdEncoding.DecodeString("dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
	sig := hmacSHA256(pv.storedKey, authMessage)
	clientKey := make([]byte, len(proof))
	for i := range proof {
		clientKey[i] = proof[i] ^ sig[i]
	}
	if sum := sha256.Sum256(clientKey); string(sum[:]) != string(pv.storedKey) {
		t.Fatal("the StoredKey does not accept RFC 7677's client proof")
	}
	if !verifierMatches(v, "pencil") || verifierMatches(v, "pencil ") || verifierMatches(v, "Pencil") {
		t.Fatal("verifierMatches does not tell pencil from its neighbours")
	}
}

// TestVerifierMatchesPostgres has PostgreSQL hash a password itself
// (password_encryption = scram-sha-256) and checks that our verifier of the
// same password, salt and iterations is the same string, and that our check
// accepts that password and no other.
func TestVerifierMatchesPostgres(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	role := e.role("pgmade")
	if _, err := e.admin.Exec(ctx, "SET password_encryption = 'scram-sha-256'"); err != nil {
		t.Fatal(err)
	}
	// A throwaway password: this is the one place a plaintext goes to the
	// server, to have the server's own hash to compare with.
	if _, err := e.admin.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" PASSWORD 'server-side p4ss'"); err != nil {
		t.Fatal(err)
	}
	stored := e.roleState(role).verifier
	pv, ok := parseVerifier(stored)
	if !ok {
		t.Fatalf("PostgreSQL's verifier %q does not parse", stored)
	}
	ours, err := scramVerifier("server-side p4ss", pv.salt, pv.iterations)
	if err != nil {
		t.Fatal(err)
	}
	if ours != stored {
		t.Fatalf("our verifier %s differs from PostgreSQL's %s", ours, stored)
	}
	if !verifierMatches(stored, "server-side p4ss") || verifierMatches(stored, "server-side p4sS") {
		t.Fatal("verifierMatches does not check PostgreSQL's verifier correctly")
	}
	// And PostgreSQL takes ours as a verifier, storing it unchanged rather
	// than hashing it as if it were a password.
	v, err := newVerifier("ours")
	if err != nil {
		t.Fatal(err)
	}
	lit, err := verifierLiteral(v)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.Exec(ctx, "ALTER ROLE "+pgx.Identifier{role}.Sanitize()+" PASSWORD "+lit); err != nil {
		t.Fatal(err)
	}
	if got := e.roleState(role).verifier; got != v || !verifierMatches(got, "ours") {
		t.Fatalf("PostgreSQL stored %q for our verifier %q", got, v)
	}
}

// TestVerifierParsingAndQuoting refuses what is not a SCRAM-SHA-256
// verifier, and any literal that could leave its quotes.
func TestVerifierParsingAndQuoting(t *testing.T) {
	good, err := newVerifier("x")
	if err != nil {
		t.Fatal(err)
	}
	if !verifierPattern.MatchString(good) || !strings.HasPrefix(good, "SCRAM-SHA-256$4096:") {
		t.Fatalf("fresh verifier %q", good)
	}
	for _, s := range []string{
		"", "md5" + strings.Repeat("a", 32), "x", "plaintext",
		"SCRAM-SHA-256$0:AAAA$" + strings.Repeat("A", 43) + "=:" + strings.Repeat("A", 43) + "=",
		"SCRAM-SHA-256$4096:AAAA$AAAA:AAAA",
		good + "'; DROP ROLE postgres; --",
		strings.Replace(good, "$4096", "$99999999999999999999", 1),
	} {
		if _, ok := parseVerifier(s); ok {
			t.Errorf("parseVerifier accepted %q", s)
		}
		if verifierMatches(s, "x") {
			t.Errorf("verifierMatches accepted %q", s)
		}
	}
	for _, s := range []string{"a'b", `a\b`, good + "'", "SCRAM-SHA-256$4096:a'b$c:d", good + "\n"} {
		if _, err := verifierLiteral(s); err == nil {
			t.Errorf("verifierLiteral quoted %q", s)
		}
	}
	lit, err := verifierLiteral(good)
	if err != nil || lit != "'"+good+"'" {
		t.Fatalf("verifierLiteral(%q) = %q, %v", good, lit, err)
	}
}
