package join

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strings"
	"unicode"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/internal/strictjson"
)

// maxInstanceID bounds an instance ID: metadata servers answer short
// tokens, and anything longer is not one.
const maxInstanceID = 256

// EvidenceOf returns the hex SHA-256 of a file, byte for byte: the
// evidenceSHA256 an invitation for the box that published it carries.
func EvidenceOf(path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:]), nil
}

// SignInvitation signs an invitation payload with the console's ed25519 key
// and returns the data of the invitation.written event that carries it.
func SignInvitation(key crypto.Signer, inv events.Invitation) (events.InvitationWritten, error) {
	payload, err := json.Marshal(inv)
	if err != nil {
		return events.InvitationWritten{}, err
	}
	env, err := signing.SignEnvelope(key, events.PayloadTypeInvitation, payload)
	if err != nil {
		return events.InvitationWritten{}, fmt.Errorf("sign the invitation for %s: %w", inv.Box, err)
	}
	return events.InvitationWritten{Box: inv.Box, Envelope: env}, nil
}

// SignHostFloor signs a host floor payload with the release ed25519 key and
// returns the data of the hostfloor.published event that carries it.
func SignHostFloor(key crypto.Signer, floor events.HostFloor) (events.HostFloorPublished, error) {
	payload, err := json.Marshal(floor)
	if err != nil {
		return events.HostFloorPublished{}, err
	}
	env, err := signing.SignEnvelope(key, events.PayloadTypeHostFloor, payload)
	if err != nil {
		return events.HostFloorPublished{}, fmt.Errorf("sign the host floor for %s: %w", floor.Deployment, err)
	}
	return events.HostFloorPublished{Deployment: floor.Deployment, Envelope: env}, nil
}

// readIdentity reads the identity record and its SHA-256. An error means
// the fact could not be read (retry); a record that reads but does not
// parse is returned with parseErr set, since that is a fact about the file.
func readIdentity(path string) (rec IdentityRecord, sum string, parseErr error, err error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return rec, "", nil, fmt.Errorf("the identity record %s cannot be read: %w", path, err)
	}
	h := sha256.Sum256(raw)
	sum = hex.EncodeToString(h[:])
	if !json.Valid(raw) {
		return rec, sum, fmt.Errorf("the identity record %s is not JSON", path), nil
	}
	// The console invites the record by its SHA-256 after reading it, so
	// the worker reads it as a reviewer does: exact key names, and no key
	// twice (which readers resolve differently). The record may hold more
	// than box and instanceId, so other keys are allowed.
	var fields map[string]json.RawMessage
	if err := strictjson.Decode(raw, &fields); err != nil {
		return rec, sum, fmt.Errorf("the identity record %s is not one JSON object with each key once: %v", path, err), nil
	}
	for name, into := range map[string]*string{"box": &rec.Box, "instanceId": &rec.InstanceID} {
		if v, ok := fields[name]; ok {
			if err := json.Unmarshal(v, into); err != nil {
				return rec, sum, fmt.Errorf("the identity record %s: its %s is not a string: %v", path, name, err), nil
			}
		}
	}
	return rec, sum, nil, nil
}

// instanceID reads this instance's ID from its file or metadata URL. Any
// failure means the fact could not be read, never that the ID is empty.
func instanceID(ctx context.Context, cfg Config, client *http.Client) (string, error) {
	var raw []byte
	var where string
	switch {
	case cfg.InstanceIDFile != "":
		where = cfg.InstanceIDFile
		b, err := os.ReadFile(cfg.InstanceIDFile)
		if err != nil {
			return "", fmt.Errorf("this instance's ID cannot be read: %w", err)
		}
		raw = b
	case cfg.InstanceIDURL != "":
		where = cfg.InstanceIDURL
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.InstanceIDURL, nil)
		if err != nil {
			return "", fmt.Errorf("this instance's ID cannot be read from %s: %w", where, err)
		}
		// GCE's metadata server answers only requests that carry this;
		// other servers ignore it.
		req.Header.Set("Metadata-Flavor", "Google")
		if client == nil {
			client = http.DefaultClient
		}
		resp, err := client.Do(req)
		if err != nil {
			return "", fmt.Errorf("this instance's ID cannot be read from %s: %w", where, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxInstanceID+2))
		if err != nil {
			return "", fmt.Errorf("this instance's ID cannot be read from %s: %w", where, err)
		}
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("this instance's ID cannot be read from %s: HTTP %s", where, resp.Status)
		}
		raw = b
	default:
		return "", errors.New("this instance's ID cannot be read: neither --instance-id-file nor --instance-id-url is set")
	}
	id := string(bytes.TrimSpace(raw))
	switch {
	case id == "":
		return "", fmt.Errorf("this instance's ID cannot be read: %s is empty", where)
	case len(id) > maxInstanceID:
		return "", fmt.Errorf("this instance's ID cannot be read: %s holds more than %d bytes", where, maxInstanceID)
	case strings.IndexFunc(id, unicode.IsControl) >= 0:
		return "", fmt.Errorf("this instance's ID cannot be read: %s holds control characters", where)
	}
	return id, nil
}

// readEnrollmentFile reads an enrollment document (enrollment.json or the
// armed marker). exists is false when there is no such file; err is set
// when the fact cannot be read (I/O or content that is not one).
func readEnrollmentFile(path string) (doc Enrollment, exists bool, err error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return doc, false, nil
	}
	if err != nil {
		return doc, true, fmt.Errorf("%s cannot be read: %w", path, err)
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return doc, true, fmt.Errorf("%s is not an enrollment document (JSON box, enrollment, instanceId): %v", path, err)
	}
	return doc, true, nil
}

// readPolicy reads policy.json the same way.
func readPolicy(path string) (p Policy, exists bool, err error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return p, false, nil
	}
	if err != nil {
		return p, true, fmt.Errorf("%s cannot be read: %w", path, err)
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return p, true, fmt.Errorf("%s is not a guard policy (JSON schema, deployment, mode, floor): %v", path, err)
	}
	return p, true, nil
}
