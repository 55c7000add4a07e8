// Package agekey is the one place Steward makes, reads and uses age
// identities: X25519 keys in the file format age-keygen writes, and armored
// ciphertext the age command line tool opens too.
//
// Nothing here ever puts key material or plaintext into an error: age's own
// messages quote the lines they could not parse, and a field meant for
// ciphertext may hold a pasted password, so those quotes are blanked.
package agekey

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"regexp"
	"strings"
	"time"

	"filippo.io/age"
	"filippo.io/age/armor"

	"github.com/steward-dev/steward/internal/atomicfile"
)

// MaxPlaintext bounds what Decrypt returns. The event schemas cap a
// ciphertext at 64 KiB already; the bound here keeps callers from trusting
// that.
const MaxPlaintext = 64 << 10

var (
	// ErrNoMatch says the ciphertext was encrypted to another key.
	ErrNoMatch = errors.New("not encrypted to this identity")
	// ErrNotArmored says the input is not armored age ciphertext at all.
	ErrNotArmored = errors.New("not armored age ciphertext (it must begin with " + armor.Header + ")")
	// ErrMalformed says the ciphertext is armored age but damaged:
	// corrupted, truncated or not age inside.
	ErrMalformed = errors.New("not a well-formed armored age file")
	// ErrTooLarge says the plaintext is over MaxPlaintext bytes.
	ErrTooLarge = fmt.Errorf("the plaintext is over %d bytes", MaxPlaintext)
)

// Identity is an age identity file as loaded: the keys it holds and the
// recipients they open, which refusals name so an operator knows what to
// encrypt to.
type Identity struct {
	ids        []age.Identity
	recipients []string
}

// Generate writes a new X25519 identity to path in the format age-keygen
// writes (two comment lines, then the secret key), mode 0600, atomically,
// and returns its recipient. It never overwrites: an existing path is an
// error wrapping fs.ErrExist, so a key is not lost to a second run.
func Generate(path string) (recipient string, err error) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		return "", fmt.Errorf("generate an age identity for %s: %w", path, err)
	}
	recipient = id.Recipient().String()
	content := fmt.Sprintf("# created: %s\n# public key: %s\n%s\n", time.Now().Format(time.RFC3339), recipient, id.String())
	if err := atomicfile.WriteNew(path, []byte(content), 0o600); err != nil {
		return "", err
	}
	return recipient, nil
}

// Load reads an identity file as age-keygen writes it (comments, blank
// lines, one secret key a line). A missing file is an error wrapping
// fs.ErrNotExist. Its errors name the file and never quote its lines.
func Load(path string) (*Identity, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read age identity: %w", err)
	}
	defer f.Close()
	ids, err := age.ParseIdentities(f)
	if err != nil {
		return nil, fmt.Errorf("%s holds no age identity in the format age-keygen writes (%s)", path, unquote(err))
	}
	out := &Identity{ids: ids}
	for _, id := range ids {
		switch id := id.(type) {
		case *age.X25519Identity:
			out.recipients = append(out.recipients, id.Recipient().String())
		case *age.HybridIdentity:
			out.recipients = append(out.recipients, id.Recipient().String())
		}
	}
	if len(out.recipients) == 0 {
		return nil, fmt.Errorf("%s holds no age identity with a recipient Steward can encrypt to (X25519 or hybrid)", path)
	}
	return out, nil
}

// LoadOrGenerate loads the identity at path, or generates one there when
// the file does not exist; created says which. A file that exists but does
// not parse is an error and is left as it is.
func LoadOrGenerate(path string) (id *Identity, created bool, err error) {
	id, err = Load(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return id, false, err
	}
	if _, err := Generate(path); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, false, err
	} else if err != nil {
		// Another process made it meanwhile: that one is the key.
		id, err = Load(path)
		return id, false, err
	}
	id, err = Load(path)
	return id, err == nil, err
}

// Recipients returns the recipients ("age1...") the identity opens, in the
// order of the file.
func (id *Identity) Recipients() []string { return append([]string(nil), id.recipients...) }

// Decrypt opens an armored age file. Every error is a property of the
// ciphertext (no retry changes it), wraps ErrNotArmored, ErrNoMatch,
// ErrMalformed or ErrTooLarge, and carries neither plaintext nor a line of
// the input.
func (id *Identity) Decrypt(armored string) ([]byte, error) {
	// Blank lines or indentation around the block (a paste into YAML) are
	// not the ciphertext's; the armor reader allows only a little of them.
	armored = strings.TrimSpace(armored)
	if !strings.HasPrefix(armored, armor.Header) {
		return nil, ErrNotArmored
	}
	r, err := age.Decrypt(armor.NewReader(strings.NewReader(armored+"\n")), id.ids...)
	if err != nil {
		var nm *age.NoIdentityMatchError
		if errors.As(err, &nm) {
			return nil, fmt.Errorf("%w (it is for another key; encrypt it to %s)", ErrNoMatch, strings.Join(id.recipients, " or "))
		}
		return nil, fmt.Errorf("%w (%s)", ErrMalformed, unquote(err))
	}
	plain, err := io.ReadAll(io.LimitReader(r, MaxPlaintext+1))
	if err != nil {
		clear(plain)
		return nil, fmt.Errorf("%w: the ciphertext does not authenticate, so it was corrupted or truncated (%s)", ErrMalformed, unquote(err))
	}
	if len(plain) > MaxPlaintext {
		clear(plain)
		return nil, ErrTooLarge
	}
	return plain, nil
}

// Encrypt encrypts plaintext to one recipient ("age1...", X25519 or
// hybrid) and returns the armored age file, the form events carry. The age
// command line tool (age -d -i <identity>) opens it too.
func Encrypt(recipient string, plaintext []byte) (armored string, err error) {
	recipient = strings.TrimSpace(recipient)
	if !strings.HasPrefix(recipient, "age1") {
		// Not quoted: a secret key pasted in the wrong place lands here.
		return "", errors.New("the recipient is not an age recipient: it must begin with age1 (the public key age-keygen prints, never the AGE-SECRET-KEY line)")
	}
	var r age.Recipient
	r, err = age.ParseX25519Recipient(recipient)
	if err != nil {
		var herr error
		if r, herr = age.ParseHybridRecipient(recipient); herr != nil {
			return "", fmt.Errorf("recipient %q is not an age X25519 recipient: %s", recipient, unquote(err))
		}
	}
	var out bytes.Buffer
	aw := armor.NewWriter(&out)
	w, err := age.Encrypt(aw, r)
	if err != nil {
		return "", fmt.Errorf("encrypt to %s: %w", recipient, err)
	}
	if _, err := w.Write(plaintext); err != nil {
		return "", fmt.Errorf("encrypt to %s: %w", recipient, err)
	}
	if err := w.Close(); err != nil {
		return "", fmt.Errorf("encrypt to %s: %w", recipient, err)
	}
	if err := aw.Close(); err != nil {
		return "", fmt.Errorf("encrypt to %s: %w", recipient, err)
	}
	return out.String(), nil
}

// quoted matches the %q segments age's errors put in: they quote the
// offending line, which may be key material or a pasted plaintext, so no
// line of it reaches a reason, a log or the DLQ.
var quoted = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

func unquote(err error) string { return quoted.ReplaceAllString(err.Error(), `"…"`) }
