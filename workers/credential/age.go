package credential

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"filippo.io/age"
	"filippo.io/age/armor"

	"github.com/steward-dev/steward/internal/atomicfile"
)

// MaxSecretBytes bounds a decrypted secret. The schema already caps the
// ciphertext at 64 KiB; the bound here keeps the handler from trusting that.
const MaxSecretBytes = 64 << 10

// EncryptSecret encrypts secret to one X25519 recipient ("age1...") and
// returns the armored age file, the form a credential.rotated event carries.
// The age command line tool (age -d -i <identity>) opens it too.
func EncryptSecret(recipient string, secret []byte) (string, error) {
	r, err := age.ParseX25519Recipient(strings.TrimSpace(recipient))
	if err != nil {
		return "", fmt.Errorf("recipient %q is not an age X25519 recipient (age1...): %w", recipient, err)
	}
	var out bytes.Buffer
	aw := armor.NewWriter(&out)
	w, err := age.Encrypt(aw, r)
	if err != nil {
		return "", fmt.Errorf("encrypt the secret to %s: %w", recipient, err)
	}
	if _, err := w.Write(secret); err != nil {
		return "", fmt.Errorf("encrypt the secret to %s: %w", recipient, err)
	}
	if err := w.Close(); err != nil {
		return "", fmt.Errorf("encrypt the secret to %s: %w", recipient, err)
	}
	if err := aw.Close(); err != nil {
		return "", fmt.Errorf("encrypt the secret to %s: %w", recipient, err)
	}
	return out.String(), nil
}

// GenerateIdentity writes a new X25519 age identity to path in the format
// age-keygen writes (two comment lines, then the secret key), mode 0600, and
// returns its recipient. It never overwrites: an existing path is an error
// wrapping fs.ErrExist, so a hive's key is not lost to a second run.
func GenerateIdentity(path string) (recipient string, err error) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		return "", fmt.Errorf("generate an age identity for %s: %w", path, err)
	}
	recipient = id.Recipient().String()
	content := fmt.Sprintf("# created: %s\n# public key: %s\n%s\n", time.Now().Format(time.RFC3339), recipient, id.String())
	if err := createExclusive(path, []byte(content), 0o600); err != nil {
		return "", err
	}
	return recipient, nil
}

// createExclusive writes data to a temporary file, fsyncs it and links it
// to path: the link fails if path exists, so this is both atomic (a reader
// never sees half a key) and refuses to overwrite, which a rename would not.
func createExclusive(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	if _, err := os.Lstat(path); err == nil {
		return fmt.Errorf("%s already exists; refusing to overwrite it: %w", path, fs.ErrExist)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	if err := tmp.Chmod(perm); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("write %s: fsync: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%s already exists; refusing to overwrite it: %w", path, fs.ErrExist)
		}
		return fmt.Errorf("write %s: %w", path, err)
	}
	return atomicfile.SyncDir(dir)
}

// identity is a hive's loaded age identity and the recipients it opens,
// which refusals name so an operator knows what to encrypt to.
type identity struct {
	ids        []age.Identity
	recipients []string
}

// loadIdentity reads an identity file as age-keygen writes it. Its errors
// never quote the file's lines: they may hold key material.
func loadIdentity(path string) (*identity, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ids, err := age.ParseIdentities(f)
	if err != nil {
		return nil, fmt.Errorf("%s is not an age identity file as age-keygen writes it: %w", path, err)
	}
	out := &identity{ids: ids}
	for _, id := range ids {
		switch id := id.(type) {
		case *age.X25519Identity:
			out.recipients = append(out.recipients, id.Recipient().String())
		case *age.HybridIdentity:
			out.recipients = append(out.recipients, id.Recipient().String())
		}
	}
	return out, nil
}

// quoted matches the %q segments age's parse errors put in: they quote the
// offending line, and a field meant for ciphertext may hold a pasted
// plaintext, so no line of it reaches a reason, a log or the DLQ.
var quoted = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

func unquote(err error) string { return quoted.ReplaceAllString(err.Error(), `"…"`) }

// errNoMatch says the secret was encrypted to someone else.
var errNoMatch = errors.New("not encrypted to this hive's identity")

// decrypt opens an armored age file. Every error is a property of the
// ciphertext (no retry changes it), and none carries plaintext.
func (id *identity) decrypt(armored string) ([]byte, error) {
	r, err := age.Decrypt(armor.NewReader(strings.NewReader(armored)), id.ids...)
	if err != nil {
		var nm *age.NoIdentityMatchError
		if errors.As(err, &nm) {
			return nil, fmt.Errorf("%w (it is for another key; encrypt it to %s)", errNoMatch, strings.Join(id.recipients, " or "))
		}
		return nil, fmt.Errorf("not a well-formed armored age file (%s)", unquote(err))
	}
	secret, err := io.ReadAll(io.LimitReader(r, MaxSecretBytes+1))
	if err != nil {
		clear(secret)
		return nil, fmt.Errorf("the ciphertext does not authenticate, so it was corrupted or truncated (%s)", unquote(err))
	}
	if len(secret) > MaxSecretBytes {
		clear(secret)
		return nil, fmt.Errorf("the decrypted secret is over %d bytes", MaxSecretBytes)
	}
	return secret, nil
}
