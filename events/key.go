package events

import (
	"fmt"
	"regexp"

	"github.com/Masterminds/semver/v3"
)

// KeyPattern is the rule every key obeys: one NATS subject token that is also
// a safe file name and SQL-free identifier part.
const KeyPattern = `^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$`

// CheckKey refuses anything that is not one plain subject token: dots, '*',
// '>', spaces, slashes and '..' never reach a subject, a path or SQL.
func CheckKey(key string) error {
	if !isKey(key) {
		return fmt.Errorf("key %q does not match %s (a letter or digit, then up to 62 letters, digits, '_' or '-')", key, KeyPattern)
	}
	return nil
}

// isKey matches KeyPattern with a loop rather than regexp: every event
// is checked against it, and the loop costs a tenth of the match.
// TestIsKeyIsKeyPattern holds the two together.
func isKey(key string) bool {
	if len(key) == 0 || len(key) > 63 {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		alnum := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		if !alnum && (i == 0 || c != '_' && c != '-') {
			return false
		}
	}
	return true
}

// versionPattern is strict semver 2.0 without a leading "v": anything a
// registry path could be tricked with (slashes, "..", a scheme) fails it.
var versionPattern = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

// CheckVersion refuses a release version that is not a strict semantic
// version (MAJOR.MINOR.PATCH, optional pre-release and build, no "v").
func CheckVersion(v string) error {
	if len(v) > 128 || !versionPattern.MatchString(v) {
		return fmt.Errorf("version %q is not a semantic version MAJOR.MINOR.PATCH[-pre][+build]", v)
	}
	return nil
}

// ParseVersion parses a version that CheckVersion accepts.
func ParseVersion(v string) (*semver.Version, error) {
	if err := CheckVersion(v); err != nil {
		return nil, err
	}
	return semver.StrictNewVersion(v)
}
