package pgserver

import (
	"fmt"
	"os"
)

// TempDir makes a new temporary folder, named from pattern as by
// os.MkdirTemp, that a cluster can be kept below. os.MkdirTemp makes it 0700,
// which keeps the postgres user out when Steward runs as root (Start then
// refuses, naming the folder); TempDir makes it 0711, so the server's user
// can pass through but not list it. The caller removes it.
func TempDir(pattern string) (string, error) {
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("let PostgreSQL's user through %s: %w", dir, err)
	}
	return dir, nil
}
