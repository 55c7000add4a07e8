package ops_test

import (
	"context"
	"strings"
	"testing"

	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/workers/workertest"
)

// TestListKeysByPrefix lists the credential worker's keys from the
// stream's subject counts, with and without a prefix.
func TestListKeysByPrefix(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	for _, p := range []struct {
		hive    string
		version int
	}{{"hive-a", 1}, {"hive-a", 2}, {"hive-b", 1}, {"other", 1}} {
		publishTraced(t, js, p.hive, p.version, "")
	}
	got := func(prefix string) string {
		l, err := ops.ListKeys(context.Background(), js, ops.KeyOptions{Worker: "credential", Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		var s []string
		for _, k := range l.Keys {
			s = append(s, k.Key+":"+string(rune('0'+k.Events)))
		}
		return strings.Join(s, " ")
	}
	if g := got(""); g != "hive-a:2 hive-b:1 other:1" {
		t.Fatalf("every key: %q", g)
	}
	if g := got("hive-"); g != "hive-a:2 hive-b:1" {
		t.Fatalf("prefix hive-: %q", g)
	}
	if g := got("nope"); g != "" {
		t.Fatalf("prefix nope: %q", g)
	}
	if _, err := ops.ListKeys(context.Background(), js, ops.KeyOptions{Worker: "no worker"}); err == nil || !strings.Contains(err.Error(), "worker") {
		t.Fatalf("a worker that is no subject token: %v", err)
	}
}
