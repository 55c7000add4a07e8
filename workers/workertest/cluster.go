package workertest

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// Cluster is an embedded JetStream cluster of a few nats-servers in this
// process, routed to each other on 127.0.0.1, each with its store in a
// temporary folder.
type Cluster struct {
	Nodes []*server.Server
}

// StartCluster starts a JetStream cluster of size nodes and waits until it
// has a meta leader, so replicated streams can be created at once.
func StartCluster(t testing.TB, size int) *Cluster {
	t.Helper()
	ports := make([]int, size)
	for i := range ports {
		ports[i] = FreePort(t)
	}
	var routes []*url.URL
	for _, p := range ports {
		routes = append(routes, &url.URL{Scheme: "nats", Host: fmt.Sprintf("127.0.0.1:%d", p)})
	}
	c := &Cluster{}
	for i := range size {
		opts := &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1",
			Port:       server.RANDOM_PORT,
			JetStream:  true,
			StoreDir:   t.TempDir(),
			NoLog:      true,
			NoSigs:     true,
			Cluster:    server.ClusterOpts{Name: "steward-test", Host: "127.0.0.1", Port: ports[i]},
			Routes:     routes,
		}
		srv, err := server.NewServer(opts)
		if err != nil {
			t.Fatalf("nats server %d: %v", i+1, err)
		}
		srv.Start()
		t.Cleanup(srv.Shutdown)
		c.Nodes = append(c.Nodes, srv)
	}
	for _, n := range c.Nodes {
		if !n.ReadyForConnections(10 * time.Second) {
			t.Fatalf("nats server %s did not become ready in 10s", n.Name())
		}
	}
	WaitUntil(t, "the cluster has a JetStream meta leader", func() bool {
		for _, n := range c.Nodes {
			if n.JetStreamIsLeader() {
				return true
			}
		}
		return false
	})
	return c
}

// URLs is every node's client URL, comma-separated, as clients take it.
func (c *Cluster) URLs() string {
	var urls []string
	for _, n := range c.Nodes {
		urls = append(urls, n.ClientURL())
	}
	return strings.Join(urls, ",")
}

// JetStream connects to node i (failing over to the others) and ensures
// Steward's streams with replicas copies, retrying while the new cluster
// cannot place them yet.
func (c *Cluster) JetStream(t testing.TB, i, replicas int) jetstream.JetStream {
	t.Helper()
	urls := c.Nodes[i].ClientURL() + "," + c.URLs()
	nc, err := nats.Connect(urls, nats.DontRandomize(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("connect %s: %v", urls, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := events.DefaultStreamConfig()
	cfg.Replicas = replicas
	var last error
	WaitUntil(t, "the streams are created on the cluster", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		last = events.EnsureStreams(ctx, js, cfg)
		return last == nil
	})
	return js
}
