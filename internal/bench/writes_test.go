package bench

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/proof"
)

// writeKey is the key of the i-th write: writes go round 64 keys, as the
// bench's events do.
func writeKey(i int) string { return "k" + strconv.Itoa(i%64) }

// writeKind is one way of making a confirmed write to the server: set
// makes what it writes to, fresh (name is unique to the call).
type writeKind struct {
	name string
	set  func(ctx context.Context, e *Env, name string) (writes, error)
}

// writes is what a kind's set made: write makes the i-th write; stream is
// the stream that holds what is written ("" when nothing is, as with the
// pace alone), and subject the subject the i-th value is stored under.
type writes struct {
	write   func(ctx context.Context, i int) error
	stream  string
	subject func(i int) string
}

// bucketOf is what writes to the bucket name hold: its stream and the
// subject of the i-th value's key, as nats.go names them.
func bucketOf(name string, key func(i int) string, write func(ctx context.Context, i int) error) writes {
	return writes{write: write, stream: "KV_" + name, subject: func(i int) string { return "$KV." + name + "." + key(i) }}
}

// signedKey is where the signed checkpoint kind stores its i-th write: a
// lane's checkpoint, as the runtime keys one.
func signedKey(i int) string { return events.LaneCheckpointKey("bench", "writes", writeKey(i)) }

// bucketWrites writes compare-and-set (casWriter, as the checkpointing
// path does) into a bucket made as a nats.go user makes one (a name, file
// storage) keeping history values of each key.
func bucketWrites(history uint8, value []byte) func(context.Context, *Env, string) (writes, error) {
	return func(ctx context.Context, e *Env, name string) (writes, error) {
		kv, err := e.subJS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: name, Storage: jetstream.FileStorage, History: history})
		if err != nil {
			return writes{}, err
		}
		write := casWriter(kv)
		return bucketOf(name, writeKey, func(ctx context.Context, i int) error { return write(ctx, writeKey(i), value) }), nil
	}
}

// signedSize is about the size of a signed checkpoint as the runtime writes
// it, so a plain value of that size tells the signature's CPU from its
// bytes' (TestWriteKindsWriteWhatTheySay keeps it within a quarter).
const signedSize = 256

// writeKinds are the kinds BenchmarkWrites compares.
func writeKinds(signer *proof.Signer) []writeKind {
	small, large := []byte("12345678"), make([]byte, signedSize)
	for i := range large {
		large[i] = 'a' + byte(i%26)
	}
	return []writeKind{
		{"publish to a stream", func(ctx context.Context, e *Env, name string) (writes, error) {
			if _, err := e.subJS.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.FileStorage}); err != nil {
				return writes{}, err
			}
			subject := func(i int) string { return name + "." + writeKey(i) }
			return writes{write: func(ctx context.Context, i int) error {
				_, err := e.subJS.Publish(ctx, subject(i), small)
				return err
			}, stream: name, subject: subject}, nil
		}},
		{"bucket, history 1", bucketWrites(1, small)},
		{"bucket, history 64", bucketWrites(64, small)},
		{"bucket, history 1, signed size", bucketWrites(1, large)},
		{"signed checkpoint", func(ctx context.Context, e *Env, name string) (writes, error) {
			kv, err := e.subJS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: name, Storage: jetstream.FileStorage})
			if err != nil {
				return writes{}, err
			}
			docs := events.NewStore(kv, events.StoreOptions{Signer: signer})
			revisions := map[string]uint64{}
			return bucketOf(name, signedKey, func(ctx context.Context, i int) error {
				key := signedKey(i)
				cp := events.Checkpoint{Applied: uint64(i + 1), EventID: fmt.Sprintf("bench-writes-%d", i)}
				rev, err := docs.Put(ctx, key, cp, revisions[key])
				revisions[key] = rev
				return err
			}), nil
		}},
	}
}

// BenchmarkWrites measures what one confirmed write costs the server and
// this process, by kind, with the server in a process of its own: a
// publish to a plain stream; a compare-and-set update of a key in a bucket
// made as a nats.go user makes one, keeping one value of each key and
// keeping 64, with a value of 8 bytes and one of a signed checkpoint's
// size; and the runtime's own write, a checkpoint signed and written
// through events.Store. Each kind writes b.N times round 64 keys, one
// write at a time and back to back, in 5 rounds whose first kind changes
// from round to round, and it reports each kind's median CPU per write,
// the server's and this process's. It says whether any shape of bucket
// makes the checkpoint's write cheaper than the publish it is, and what
// the signature adds. Run it with a fixed count:
// go test -run '^$' -bench '^BenchmarkWrites$' -benchtime 20000x ./internal/bench
func BenchmarkWrites(b *testing.B) { measureWrites(b, 0) }

// BenchmarkPacedWrites measures the same writes as BenchmarkWrites, paced
// at the bench's steady 1,000 a second instead of back to back, as the
// checkpoint is written at `steward bench --rate 1000`: every write then
// finds the server and this process asleep and wakes them, where a write
// back to back finds them awake. Beside the kinds it measures the pace
// alone (the same timer, no write), what this process spends waking for
// its turn, which a consumer woken by its event's arrival spends instead.
// A kind's paced CPU per write less its back-to-back CPU, and less the
// pace alone, is what waking costs it. Run it with a fixed count:
// go test -run '^$' -bench PacedWrites -benchtime 2000x ./internal/bench
func BenchmarkPacedWrites(b *testing.B) { measureWrites(b, 1000) }

// paceAlone is the kind BenchmarkPacedWrites adds: its turn comes at the
// pace, and it writes nothing.
var paceAlone = writeKind{name: "pace alone",
	set: func(context.Context, *Env, string) (writes, error) {
		return writes{write: func(context.Context, int) error { return nil }}, nil
	}}

// measureWrites runs BenchmarkWrites (rate 0: back to back) or
// BenchmarkPacedWrites (rate writes a second).
func measureWrites(b *testing.B, rate int) {
	ctx := context.Background()
	env, err := StartProcess(ctx, []string{os.Args[0], "fleet-server"})
	if err != nil {
		b.Fatal(err)
	}
	defer env.Close()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	kinds := writeKinds(proof.NewSigner(priv, "bench-writes", ""))
	if rate > 0 {
		kinds = append(kinds, paceAlone)
	}
	const rounds = 5
	// Nanoseconds per write, by kind, one figure a round.
	server := make([][]int64, len(kinds))
	client := make([][]int64, len(kinds))
	for r := range rounds {
		for j := range kinds {
			k := (r + j) % len(kinds)
			name := fmt.Sprintf("BENCH_WRITES_%d_%d", r, k)
			w, err := kinds[k].set(ctx, env, name)
			if err != nil {
				b.Fatalf("%s: %v", kinds[k].name, err)
			}
			// Each key's first write creates it: warm every key up, and
			// the stream's first block, before measuring.
			for i := range 1000 {
				if err := w.write(ctx, i); err != nil {
					b.Fatalf("%s, warming up: %v", kinds[k].name, err)
				}
			}
			runtime.GC()
			start := env.cpu()
			began := time.Now()
			for i := range b.N {
				if err := waitTurn(ctx, began, i, rate); err != nil {
					b.Fatal(err)
				}
				if err := w.write(ctx, 1000+i); err != nil {
					b.Fatalf("%s, write %d: %v", kinds[k].name, i, err)
				}
			}
			used := env.cpu().since(start)
			server[k] = append(server[k], int64(used.server)/int64(b.N))
			client[k] = append(client[k], int64(used.all-used.server)/int64(b.N))
			if w.stream == "" {
				continue
			}
			if err := env.subJS.DeleteStream(ctx, w.stream); err != nil {
				b.Fatalf("%s: delete %s: %v", kinds[k].name, w.stream, err)
			}
		}
	}
	for k, kind := range kinds {
		name := strings.NewReplacer(", ", "-", " ", "-").Replace(kind.name)
		b.ReportMetric(float64(medianOf(server[k]))/1000, name+"-server-µs/write")
		b.ReportMetric(float64(medianOf(client[k]))/1000, name+"-client-µs/write")
	}
}

// TestWriteKindsWriteWhatTheySay proves BenchmarkWrites measures the
// writes it names: each kind's writes are all stored, a bucket keeps the
// history it says, each value has the size its kind says (the plain value
// standing for a signed checkpoint within a quarter of a real one's), and
// the signed checkpoint verifies as the writer's with each key at its last
// write.
func TestWriteKindsWriteWhatTheySay(t *testing.T) {
	ctx := context.Background()
	env, err := Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	const writes = 130 // two writes of every key, three of two of them
	// What each kind leaves: the values its stream holds, and the size of
	// a key's last one (a signed checkpoint's within a quarter of it).
	want := map[string]struct {
		stored uint64
		size   int
	}{
		"publish to a stream":            {writes, 8},
		"bucket, history 1":              {64, 8},
		"bucket, history 64":             {writes, 8},
		"bucket, history 1, signed size": {64, signedSize},
		"signed checkpoint":              {64, signedSize},
	}
	for k, kind := range writeKinds(proof.NewSigner(priv, "bench-writes", "")) {
		name := fmt.Sprintf("BENCH_WRITES_TEST_%d", k)
		made, err := kind.set(ctx, env, name)
		if err != nil {
			t.Fatalf("%s: %v", kind.name, err)
		}
		for i := range writes {
			if err := made.write(ctx, i); err != nil {
				t.Fatalf("%s, write %d: %v", kind.name, i, err)
			}
		}
		stream, err := env.subJS.Stream(ctx, made.stream)
		if err != nil {
			t.Fatalf("%s: %v", kind.name, err)
		}
		info, err := stream.Info(ctx)
		if err != nil {
			t.Fatalf("%s: %v", kind.name, err)
		}
		last, err := stream.GetLastMsgForSubject(ctx, made.subject(writes-1))
		if err != nil {
			t.Fatalf("%s: no last value on %s in %s, where its last write went: %v", kind.name, made.subject(writes-1), made.stream, err)
		}
		w, ok := want[kind.name]
		if !ok || info.State.Msgs != w.stored {
			t.Errorf("%s: %d values stored, want %d", kind.name, info.State.Msgs, w.stored)
		}
		if n := len(last.Data); n < w.size*3/4 || n > w.size*5/4 {
			t.Errorf("%s: a value is %d bytes, want about %d", kind.name, n, w.size)
		}
		if kind.name != "signed checkpoint" {
			continue
		}
		kv, err := env.subJS.KeyValue(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		verifier := proof.NewVerifier()
		verifier.Pin("bench-writes", pub)
		docs := events.NewStore(kv, events.StoreOptions{Verifier: verifier})
		for i := writes - 64; i < writes; i++ {
			doc, err := docs.Get(ctx, signedKey(i))
			if err != nil {
				t.Fatal(err)
			}
			var cp events.Checkpoint
			if err := doc.Decode(&cp); err != nil || !doc.Trusted || cp.Applied != uint64(i+1) {
				t.Errorf("the checkpoint of %s is %+v (trusted %v, %v), want its write %d, verified", writeKey(i), cp, doc.Trusted, err, i+1)
				break
			}
		}
	}
}
