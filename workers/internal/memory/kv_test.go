package memory

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// TestKVKeepsTheBucketsRules checks the rules events.Store relies on, as a
// JetStream bucket keeps them: one revision counter for every key, Create
// refused over a live key and allowed over a tombstone, Update refused over
// any revision but the current one, and a failing write writing nothing.
func TestKVKeepsTheBucketsRules(t *testing.T) {
	ctx := context.Background()
	kv := NewKV("B")
	if _, err := kv.Get(ctx, "a"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("get of a key never written: %v", err)
	}
	r1, err := kv.Create(ctx, "a", []byte("1"))
	if err != nil || r1 != 1 {
		t.Fatalf("create: %d %v", r1, err)
	}
	if _, err := kv.Create(ctx, "a", []byte("x")); !errors.Is(err, jetstream.ErrKeyExists) {
		t.Fatalf("create over a live key: %v", err)
	}
	r2, err := kv.Put(ctx, "b", []byte("2"))
	if err != nil || r2 != 2 {
		t.Fatalf("revisions are one counter for every key, as a bucket's stream sequence: %d %v", r2, err)
	}
	if _, err := kv.Update(ctx, "a", []byte("x"), r2); !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		t.Fatalf("update over another key's revision: %v", err)
	}
	r3, err := kv.Update(ctx, "a", []byte("3"), r1)
	if err != nil || r3 != 3 {
		t.Fatalf("update over the current revision: %d %v", r3, err)
	}
	if e, err := kv.Get(ctx, "a"); err != nil || string(e.Value()) != "3" || e.Revision() != 3 || e.Key() != "a" || e.Bucket() != "B" {
		t.Fatalf("get after update: %v %v", e, err)
	}
	if err := kv.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, "a"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("get of a deleted key: %v", err)
	}
	if _, err := kv.Create(ctx, "a", []byte("4")); err != nil {
		t.Fatalf("create over a tombstone: %v", err)
	}

	down := errors.New("bucket down")
	kv.Fail = func(key string) error {
		if key == "b" {
			return down
		}
		return nil
	}
	if _, err := kv.Put(ctx, "b", []byte("lost")); !errors.Is(err, down) {
		t.Fatalf("a failing write: %v", err)
	}
	if e, _ := kv.Get(ctx, "b"); string(e.Value()) != "2" {
		t.Fatalf("a failing write wrote %q", e.Value())
	}
}

func TestKVListsKeysByFilter(t *testing.T) {
	ctx := context.Background()
	kv := NewKV("B")
	for _, k := range []string{"st.w.i.one", "st.w.i.two", "st.w.j.one", "cp.w.i.x"} {
		if _, err := kv.Put(ctx, k, []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if err := kv.Delete(ctx, "st.w.i.two"); err != nil {
		t.Fatal(err)
	}
	l, err := kv.ListKeysFiltered(ctx, "st.w.i.>")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for k := range l.Keys() {
		got = append(got, k)
	}
	if !slices.Equal(got, []string{"st.w.i.one"}) {
		t.Fatalf("listed %v, want the live key under st.w.i", got)
	}
}
