//go:build !unix

// Package pgserver runs a private PostgreSQL cluster from the machine's
// server binaries. It needs Unix (process credentials, flock): elsewhere
// FindBin finds nothing and callers run without one.
package pgserver

import (
	"context"
	"errors"
)

// ErrNotInstalled is returned by FindBin when no folder holds PostgreSQL's
// server binaries; off Unix it always is.
var ErrNotInstalled = errors.New("a private PostgreSQL cluster needs Unix")

// Superuser is the cluster's superuser.
const Superuser = "postgres"

// FindBin finds nothing off Unix.
func FindBin(string) (string, error) { return "", ErrNotInstalled }

// Options say which cluster to run and how.
type Options struct {
	Bin      string
	Dir      string
	Settings map[string]string
	Log      func(format string, args ...any)
}

// Server is a running cluster; off Unix there is none.
type Server struct {
	Dir, Bin, Socket, LogFile, User string
	Port                            int
	Initialised                     bool
	Recovered                       string
}

// Start fails off Unix.
func Start(context.Context, Options) (*Server, error) { return nil, ErrNotInstalled }

// URL is the superuser's connection URL.
func (s *Server) URL(string) string { return "" }

// Stop does nothing off Unix.
func (s *Server) Stop() error { return nil }
