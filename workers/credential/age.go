package credential

import (
	"errors"
	"fmt"
	"strings"

	"github.com/steward-dev/steward/internal/agekey"
)

// open decrypts a rotation's secret with the hive's identity. Its error is
// the reason of a refusal: every one is a property of the ciphertext (no
// retry changes it), and none carries plaintext or a line of the input.
func (w *Worker) open(version uint64, armored string) ([]byte, error) {
	secret, err := w.id.Decrypt(armored)
	if errors.Is(err, agekey.ErrNoMatch) {
		return nil, fmt.Errorf("the secret of version %d is not encrypted to this hive's identity but to another key; encrypt it to %s", version, strings.Join(w.id.Recipients(), " or "))
	}
	if err != nil {
		return nil, fmt.Errorf("the secret of version %d cannot be opened: %w", version, err)
	}
	return secret, nil
}
