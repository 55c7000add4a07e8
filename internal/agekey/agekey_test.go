package agekey

import (
	"bytes"
	"encoding/base64"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"filippo.io/age"
)

// ageTool finds a binary of Debian's age package, failing (not skipping)
// when it is missing, so CI cannot pass without the interoperability check.
func ageTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not installed: install Debian's age package (apt-get install -y age) to run the interoperability test", name)
	}
	return path
}

func generate(t *testing.T) (*Identity, string, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "id.txt")
	recipient, err := Generate(path)
	if err != nil {
		t.Fatal(err)
	}
	id, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return id, recipient, path
}

func TestGenerate(t *testing.T) {
	keygen := ageTool(t, "age-keygen")
	path := filepath.Join(t.TempDir(), "id.txt")
	recipient, err := Generate(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("identity file mode %v, want 0600", fi.Mode().Perm())
	}
	content, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	format := regexp.MustCompile(`^# created: \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(Z|[+-]\d\d:\d\d)\n# public key: (age1[0-9a-z]+)\nAGE-SECRET-KEY-1[0-9A-Z]+\n$`)
	m := format.FindStringSubmatch(string(content))
	if m == nil || m[2] != recipient {
		t.Fatalf("the identity file is not as age-keygen writes it (or names another recipient than %s)", recipient)
	}
	// age-keygen -y derives the same recipient from the file.
	if pub, err := exec.Command(keygen, "-y", path).Output(); err != nil || strings.TrimSpace(string(pub)) != recipient {
		t.Fatalf("age-keygen -y: %q %v, want %s", pub, err, recipient)
	}
	id, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if r := id.Recipients(); len(r) != 1 || r[0] != recipient {
		t.Fatalf("Load found recipients %q, want [%s]", r, recipient)
	}
	// A second run never overwrites the key.
	if _, err := Generate(path); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second Generate: %v, want an error wrapping fs.ErrExist", err)
	}
	if again, _ := os.ReadFile(path); !bytes.Equal(again, content) {
		t.Fatal("the identity file changed on a refused overwrite")
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("temporary files left beside the identity: %d entries", len(entries))
	}
	if _, err := Generate(filepath.Join(t.TempDir(), "missing", "id.txt")); err == nil {
		t.Fatal("Generate into a missing folder succeeded")
	}
}

// TestLoadRefusesWithoutQuoting loads what is not an identity file and
// checks each error names the file and quotes none of its lines.
func TestLoadRefusesWithoutQuoting(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(filepath.Join(dir, "nope")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Load of a missing file: %v, want fs.ErrNotExist", err)
	}
	hybrid, err := age.GenerateHybridIdentity()
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]string{
		"garbage key":        "AGE-SECRET-KEY-1NOTAREALKEYBUTSECRETLOOKING\n",
		"lower-case key":     strings.ToLower(hybrid.String()[:30]) + "SECRETLOOKING\n",
		"pasted password":    "hunter2-SECRETLOOKING\n",
		"comments only":      "# created: now\n# public key: age1xyz\n",
		"empty":              "",
		"key then garbage":   generatedKey(t) + "\nSECRETLOOKING\n",
		"not UTF-8":          "\xff\xfeSECRETLOOKING\n",
		"a recipient":        "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p\n",
		"ssh key by mistake": "-----BEGIN OPENSSH PRIVATE KEY-----\nSECRETLOOKING\n",
	}
	for what, content := range cases {
		path := filepath.Join(dir, strings.ReplaceAll(what, " ", "-"))
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Load(path)
		if err == nil {
			t.Errorf("%s: loaded", what)
			continue
		}
		if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "holds no age identity") {
			t.Errorf("%s: %v does not name the file and what is wrong", what, err)
		}
		if strings.Contains(err.Error(), "SECRETLOOKING") || strings.Contains(err.Error(), "AGE-SECRET-KEY") {
			t.Errorf("%s: the error quotes the file: %v", what, err)
		}
	}
}

func generatedKey(t *testing.T) string {
	t.Helper()
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	return id.String()
}

// TestLoadOrGenerate makes the identity once, reuses it after, and leaves
// a file it cannot read as it is.
func TestLoadOrGenerate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "id.txt")
	id, created, err := LoadOrGenerate(path)
	if err != nil || !created {
		t.Fatalf("first LoadOrGenerate: created %v, %v", created, err)
	}
	first, _ := os.ReadFile(path)
	again, created, err := LoadOrGenerate(path)
	if err != nil || created {
		t.Fatalf("second LoadOrGenerate: created %v, %v", created, err)
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b, first) || again.Recipients()[0] != id.Recipients()[0] {
		t.Fatal("the second LoadOrGenerate did not reuse the identity")
	}
	if err := os.WriteFile(path, []byte("not an identity\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadOrGenerate(path); err == nil || !strings.Contains(err.Error(), "holds no age identity") {
		t.Fatalf("LoadOrGenerate over an unreadable file: %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "not an identity\n" {
		t.Fatal("LoadOrGenerate overwrote a file it could not read")
	}
}

func TestEncryptDecryptRoundTrip(t *testing.T) {
	id, recipient, _ := generate(t)
	for _, plain := range [][]byte{[]byte("s3cr3t"), {}, bytes.Repeat([]byte{0, 0xff}, MaxPlaintext/2)} {
		ct, err := Encrypt(recipient, plain)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(ct, "-----BEGIN AGE ENCRYPTED FILE-----\n") {
			t.Fatalf("ciphertext is not armored: %.60q", ct)
		}
		got, err := id.Decrypt("\n  " + ct + "\n")
		if err != nil || !bytes.Equal(got, plain) {
			t.Fatalf("round trip of %d bytes: %d bytes, %v", len(plain), len(got), err)
		}
	}
	// A hybrid (post-quantum) identity loads and opens what is encrypted
	// to the recipient it lists.
	h, err := age.GenerateHybridIdentity()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "pq.txt")
	if err := os.WriteFile(path, []byte(h.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hid, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	ct, err := Encrypt(hid.Recipients()[0], []byte("pq"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := hid.Decrypt(ct); err != nil || string(got) != "pq" {
		t.Fatalf("hybrid round trip: %q %v", got, err)
	}
}

func TestEncryptRefusesBadRecipients(t *testing.T) {
	secretKey := generatedKey(t)
	for _, r := range []string{"", "age1", "not-a-recipient", secretKey, "ssh-ed25519 AAAA", "age1qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq"} {
		out, err := Encrypt(r, []byte("s3cr3t"))
		if err == nil || out != "" {
			t.Errorf("recipient %q: %q %v, want an error", r, out, err)
			continue
		}
		if strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("recipient %q: the error carries the plaintext", r)
		}
		if strings.Contains(err.Error(), secretKey[20:]) {
			t.Errorf("a secret key given as the recipient is quoted back: %v", err)
		}
	}
}

// TestDecryptRefusals sends what a mistaken operator or an attacker would
// and checks each is refused with its sentinel, and that no error carries
// the plaintext or a line of the input.
func TestDecryptRefusals(t *testing.T) {
	id, recipient, _ := generate(t)
	_, other, _ := generate(t)
	const marker = "SECRETLOOKING-hunter2"
	enc := func(to string, plain []byte) string {
		t.Helper()
		ct, err := Encrypt(to, plain)
		if err != nil {
			t.Fatal(err)
		}
		return ct
	}
	armorOf := func(body string) string {
		return "-----BEGIN AGE ENCRYPTED FILE-----\n" + base64.StdEncoding.EncodeToString([]byte(body)) + "\n-----END AGE ENCRYPTED FILE-----\n"
	}
	corrupted := enc(recipient, []byte(marker))
	lines := strings.Split(corrupted, "\n")
	body := []byte(lines[1])
	body[20] ^= 'A' ^ 'B'
	lines[1] = string(body)
	corrupted = strings.Join(lines, "\n")
	truncated := enc(recipient, []byte(marker))
	truncated = truncated[:strings.Index(truncated, "-----END")]
	long := enc(recipient, bytes.Repeat([]byte(marker), 4000))
	longLines := strings.Split(long, "\n")
	missingLine := strings.Join(append(longLines[:3:3], longLines[4:]...), "\n")

	cases := []struct {
		what, in string
		want     error
	}{
		{"to another key", enc(other, []byte(marker)), ErrNoMatch},
		{"pasted plaintext", marker + "\n", ErrNotArmored},
		{"empty", "", ErrNotArmored},
		{"binary age", "age-encryption.org/v1\n-> X25519 " + marker + "\n", ErrNotArmored},
		{"corrupted", corrupted, ErrMalformed},
		{"truncated", truncated, ErrMalformed},
		{"a line missing", missingLine, ErrMalformed},
		{"not age inside", armorOf("not age"), ErrMalformed},
		{"plaintext inside the armor", armorOf("age-encryption.org/v1\n" + marker + "\n"), ErrMalformed},
		{"stanza quoting the input", armorOf("age-encryption.org/v1\n-> X25519 " + marker + "\n\n--- x\n"), ErrMalformed},
		{"bad closing line", "-----BEGIN AGE ENCRYPTED FILE-----\nYWdl\n" + marker + "\n", ErrMalformed},
		{"too large", enc(recipient, bytes.Repeat([]byte("x"), MaxPlaintext+1)), ErrTooLarge},
	}
	for _, c := range cases {
		got, err := id.Decrypt(c.in)
		if !errors.Is(err, c.want) || got != nil {
			t.Errorf("%s: %d bytes, %v, want %v", c.what, len(got), err, c.want)
			continue
		}
		if strings.Contains(err.Error(), "SECRETLOOKING") || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: the error quotes the input or the plaintext: %v", c.what, err)
		}
	}
	// A refusal for another key names the recipient to encrypt to.
	if _, err := id.Decrypt(enc(other, []byte("x"))); !strings.Contains(err.Error(), recipient) {
		t.Errorf("%v does not name this identity's recipient", err)
	}
}

// TestUnquoteBlanksAgeQuotes proves the blanking the refusals rely on: age's
// own messages do quote the offending line.
func TestUnquoteBlanksAgeQuotes(t *testing.T) {
	id, _, _ := generate(t)
	_, err := age.Decrypt(strings.NewReader("age-encryption.org/v1\nSECRETLOOKING\n"), id.ids...)
	if err == nil || !strings.Contains(err.Error(), "SECRETLOOKING") {
		t.Fatalf("age's error %v does not quote the line; the test no longer shows what unquote is for", err)
	}
	if s := unquote(err); strings.Contains(s, "SECRETLOOKING") || !strings.Contains(s, `"…"`) {
		t.Fatalf("unquote left %q", s)
	}
	if s := unquote(errors.New(`a "quoted \" escaped" and "second" end`)); s != `a "…" and "…" end` {
		t.Fatalf("unquote of escaped quotes: %q", s)
	}
}

// TestAgeCommandLineInterop: what Encrypt writes the age tool opens with
// the identity Generate wrote; what the age tool encrypts to an identity
// age-keygen made, Load and Decrypt open.
func TestAgeCommandLineInterop(t *testing.T) {
	ageBin := ageTool(t, "age")
	keygen := ageTool(t, "age-keygen")
	_, recipient, path := generate(t)
	secret := "s3cr3t-for-the-age-cli"
	ours, err := Encrypt(recipient, []byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	dec := exec.Command(ageBin, "-d", "-i", path)
	dec.Stdin = strings.NewReader(ours)
	var stderr bytes.Buffer
	dec.Stderr = &stderr
	plain, err := dec.Output()
	if err != nil || string(plain) != secret {
		t.Fatalf("age -d could not open Encrypt's output: %v: %s", err, stderr.String())
	}

	idPath := filepath.Join(t.TempDir(), "keygen.txt")
	if out, err := exec.Command(keygen, "-o", idPath).CombinedOutput(); err != nil {
		t.Fatalf("age-keygen: %v: %s", err, out)
	}
	pub, err := exec.Command(keygen, "-y", idPath).Output()
	if err != nil {
		t.Fatal(err)
	}
	id, err := Load(idPath)
	if err != nil {
		t.Fatalf("Load of an age-keygen identity: %v", err)
	}
	if r := id.Recipients(); len(r) != 1 || r[0] != strings.TrimSpace(string(pub)) {
		t.Fatalf("recipients %q, age-keygen -y says %s", r, pub)
	}
	enc := exec.Command(ageBin, "-r", strings.TrimSpace(string(pub)), "-a")
	enc.Stdin = strings.NewReader(secret)
	stderr.Reset()
	enc.Stderr = &stderr
	ct, err := enc.Output()
	if err != nil {
		t.Fatalf("age -r -a: %v: %s", err, stderr.String())
	}
	if got, err := id.Decrypt(string(ct)); err != nil || string(got) != secret {
		t.Fatalf("Decrypt of the age tool's output: %q %v", got, err)
	}
	if _, err := Encrypt(strings.TrimSpace(string(pub)), []byte("x")); err != nil {
		t.Fatalf("Encrypt to age-keygen's recipient: %v", err)
	}
}
