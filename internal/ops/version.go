package ops

import (
	"runtime/debug"

	"github.com/nats-io/nats.go/jetstream"
)

// Version is what a binary was built from, and the server it talks to.
type Version struct {
	Module  string `json:"module"`
	Version string `json:"version"`
	// Commit and CommitTime are the VCS revision the binary was built
	// from; Modified says the work tree had uncommitted changes.
	Commit     string `json:"commit,omitempty"`
	CommitTime string `json:"commitTime,omitempty"`
	Modified   bool   `json:"modified,omitempty"`
	Go         string `json:"go"`
	NATSClient string `json:"natsClient"`
	// Server is the NATS server connected to (nil: none).
	Server *Server `json:"server,omitempty"`
}

// Server is a NATS server as a connection sees it.
type Server struct {
	URL     string `json:"url"`
	Name    string `json:"name,omitempty"`
	Version string `json:"version,omitempty"`
	// Error says why there is no connection.
	Error string `json:"error,omitempty"`
}

// Build reads the running binary's version from its build information.
func Build() Version {
	v := Version{Version: "(unknown)", NATSClient: "(unknown)"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	v.Module, v.Version, v.Go = bi.Main.Path, bi.Main.Version, bi.GoVersion
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Commit = s.Value
		case "vcs.time":
			v.CommitTime = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	for _, d := range bi.Deps {
		if d.Path == "github.com/nats-io/nats.go" {
			v.NATSClient = d.Version
			if d.Replace != nil {
				v.NATSClient = d.Replace.Version
			}
		}
	}
	return v
}

// ServerOf is the server js is connected to.
func ServerOf(js jetstream.JetStream) *Server {
	s := &Server{URL: ServerURL(js)}
	if nc := js.Conn(); nc != nil {
		s.Name, s.Version = nc.ConnectedServerName(), nc.ConnectedServerVersion()
	}
	return s
}
