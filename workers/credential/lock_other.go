//go:build !unix

package credential

import (
	"errors"
	"fmt"
	"os"
)

// lockDir only checks the directory opens where flock does not exist; the
// runtime already handles one hive's events one at a time per process.
func lockDir(dir string) (unlock func(), err error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("the credential directory %s cannot be opened (%w); create or mount it and the rotation is retried", dir, errors.Unwrap(err))
	}
	f.Close()
	return func() {}, nil
}
