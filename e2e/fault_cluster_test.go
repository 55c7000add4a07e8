package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers/workertest"
)

// cluster is three nats-server processes on 127.0.0.1 with routes to each
// other and JetStream.
type cluster struct {
	nodes []*natsNode
}

func startCluster(t testing.TB, name string, size int) *cluster {
	t.Helper()
	c := &cluster{}
	var routes []string
	for i := range size {
		n := newNATSNode(t, fmt.Sprintf("n%d", i+1), workertest.FreePort(t))
		c.nodes = append(c.nodes, n)
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", n.clusterPort))
	}
	for _, n := range c.nodes {
		n.configure(t, name, routes)
		n.p.start()
	}
	for _, n := range c.nodes {
		n.waitHealthy(t, "?js-enabled-only=true")
	}
	return c
}

func (c *cluster) urls() string {
	var u []string
	for _, n := range c.nodes {
		u = append(u, n.url())
	}
	return strings.Join(u, ",")
}

func (c *cluster) node(name string) *natsNode {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

// streamCluster returns a stream's leader and replicas as the cluster sees
// them now.
func streamCluster(b *bus, stream string) (*jetstream.ClusterInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	s, err := b.js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	info := s.CachedInfo()
	if info.Cluster == nil {
		return nil, fmt.Errorf("stream %s has no cluster information", stream)
	}
	return info.Cluster, nil
}

// streamReplicas returns the replica count a stream is configured with.
func streamReplicas(b *bus, stream string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	s, err := b.js.Stream(ctx, stream)
	if err != nil {
		return 0, err
	}
	return s.CachedInfo().Config.Replicas, nil
}

// TestFaultClusterLeaderKilled is fault 3. Invariant: on a three-node
// cluster with the streams and the checkpoint bucket at three replicas
// (--replicas 3), killing the events stream's leader with SIGKILL
// mid-stream loses nothing acknowledged; the worker and the publisher fail
// over to the other nodes and finish; the killed node, restarted, catches
// up.
func TestFaultClusterLeaderKilled(t *testing.T) {
	const (
		keys     = 30
		versions = 20
		total    = keys * versions
	)
	c := startCluster(t, "steward-e2e", 3)
	b := connect(t, c.urls())
	b.ensureStreams(t, 3)
	fw := startFaultWorker(t, "cluster", c.urls(), 3)

	for _, name := range []string{events.StreamEvents, events.StreamOutcomes, events.StreamDLQ, "KV_" + events.CheckpointBucket} {
		replicas, err := streamReplicas(b, name)
		if err != nil || replicas != 3 {
			t.Fatalf("stream %s: %d replicas (%v); want 3", name, replicas, err)
		}
	}

	list := rotations(t, "cluster", keys, versions)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	pub := publishAll(ctx, b, list)

	waitFor(t, "a third of the events acknowledged", 2*time.Minute, func() (bool, string) {
		n := pub.count()
		return n >= total/3, strconv.Itoa(n) + " acknowledged"
	})
	ci, err := streamCluster(b, events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	leader := c.node(ci.Leader)
	if leader == nil {
		t.Fatalf("stream leader %q is none of the nodes", ci.Leader)
	}
	settled, _ := b.settled(fw.consumer())
	leader.p.kill()
	killed := time.Now()
	acked := pub.count()
	t.Logf("killed stream leader %s at %d acknowledged, %d settled", leader.name, acked, settled)

	var newLeader string
	election := waitFor(t, "a new stream leader", time.Minute, func() (bool, string) {
		ci, err := streamCluster(b, events.StreamEvents)
		if err != nil {
			return false, err.Error()
		}
		newLeader = ci.Leader
		return ci.Leader != "" && ci.Leader != leader.name, "leader " + ci.Leader
	})
	waitFor(t, "a publish acknowledged after the kill", time.Minute, func() (bool, string) {
		_, ok := pub.ackedAfter(killed)
		return ok || pub.count() == total, strconv.Itoa(pub.count()) + " acknowledged"
	})
	pubRecover, _ := pub.ackedAfter(killed)
	waitFor(t, "the worker settles events after the kill", time.Minute, func() (bool, string) {
		n, err := b.settled(fw.consumer())
		if err != nil {
			return false, err.Error()
		}
		return n > settled, strconv.FormatUint(n, 10) + " settled"
	})
	workRecover := time.Since(killed)

	// The killed node comes back while events still flow and must catch up.
	waitFor(t, "two thirds of the events acknowledged", 2*time.Minute, func() (bool, string) {
		n := pub.count()
		return n >= 2*total/3, strconv.Itoa(n) + " acknowledged"
	})
	leader.p.start()
	leader.waitHealthy(t, "?js-enabled-only=true")

	pub.wait(t, 2*time.Minute)
	waitFor(t, fw.consumer()+" has settled every event", 2*time.Minute, func() (bool, string) {
		return b.consumerIdle(fw.consumer())
	})
	catchUp := waitFor(t, "every replica of "+events.StreamEvents+" is current", 2*time.Minute, func() (bool, string) {
		ci, err := streamCluster(b, events.StreamEvents)
		if err != nil {
			return false, err.Error()
		}
		var state []string
		ok := len(ci.Replicas) == 2
		for _, r := range ci.Replicas {
			state = append(state, fmt.Sprintf("%s current=%t offline=%t lag=%d", r.Name, r.Current, r.Offline, r.Lag))
			ok = ok && r.Current && !r.Offline && r.Lag == 0
		}
		return ok, "leader " + ci.Leader + ", " + strings.Join(state, "; ")
	})
	elapsed := time.Since(start)
	v := checkStreamRun(t, b, fw, pub, list, keys, versions)
	if gone, err := fw.exited(); gone || fw.starts != 1 {
		t.Errorf("the worker exited (%v) or was restarted (%d starts); it should have failed over", err, fw.starts)
	}

	summary(t, "fault3-cluster-leader-killed",
		"events", total, "nodes", 3, "replicas", 3, "killed", leader.name+"(leader)", "new_leader", newLeader,
		"worker_restarts", fw.starts-1, "publish_retries", pub.failures, "deduplicated_acks", pub.dups,
		"applied", v.applied, "superseded", v.superseded,
		"lost", v.lost, "duplicates_applied", v.duplicates, "backwards", v.backwards,
		"election", round(election), "publish_recover", round(pubRecover), "worker_recover", round(workRecover),
		"rejoin_catch_up", round(catchUp), "elapsed", round(elapsed))
}
