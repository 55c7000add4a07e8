package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"
)

// envPrefix starts every flag's environment twin.
const envPrefix = "STEWARD_"

// envName is the environment twin of a flag: --registry is STEWARD_REGISTRY,
// --cloudrun-project is STEWARD_CLOUDRUN_PROJECT.
func envName(flag string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// applyEnv gives every flag of fs that was not set on the command line the
// value of its environment twin, when that is set. Compose files and
// systemd units configure Steward this way, with no config file. A value
// the flag refuses is an error naming the variable. Only typed flags
// (numbers, durations, booleans) refuse values; string flags such as tokens
// never do, so no secret reaches the error.
func applyEnv(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed || f.Name == "help" {
			return
		}
		name := envName(f.Name)
		v, ok := os.LookupEnv(name)
		if !ok {
			return
		}
		if setErr := fs.Set(f.Name, v); setErr != nil {
			err = fmt.Errorf("environment variable %s (twin of --%s) is not a valid %s: %w", name, f.Name, f.Value.Type(), setErr)
		}
	})
	return err
}
