package ops

import "time"

// WithClock gives a SourceKeeper its clock, so a test can move the
// keeper's time on (how long it has seen a site linked) without waiting.
func WithClock(now func() time.Time) KeeperOption {
	return func(k *SourceKeeper) { k.now = now }
}

// OnceEach is onceEach, for the test of a listing that repeats a consumer.
var OnceEach = onceEach
