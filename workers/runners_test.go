package workers

import (
	"testing"
	"time"
)

// until waits for cond, failing the test after a deadline.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 5s for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A runner counts itself idle just before it waits, so work handed over
// in that instant may start a second runner: the test allows for a few,
// where a runner that never took the next work would start twenty.
func TestARunnerThatFinishedTakesTheNextWork(t *testing.T) {
	r := newRunners()
	const pieces = 20
	for range pieces {
		done := make(chan struct{})
		r.run(func() { close(done) })
		<-done
		until(t, "a runner to wait for work", func() bool { return r.idle.Load() >= 1 })
	}
	if n := r.started.Load(); n > 3 {
		t.Fatalf("%d pieces of work one after the other started %d runners; a finished runner should have taken the next", pieces, n)
	}
}

func TestBusyRunnersNeverHoldUpNewWork(t *testing.T) {
	r := newRunners()
	release := make(chan struct{})
	running := make(chan struct{}, 2)
	for range 2 {
		r.run(func() { running <- struct{}{}; <-release })
	}
	// Both run at once: the second did not wait for the first.
	<-running
	<-running
	close(release)
	if n := r.started.Load(); n != 2 {
		t.Fatalf("%d runners started for two pieces of work at once, want 2", n)
	}
}

func TestIdleRunnersExit(t *testing.T) {
	r := newRunners()
	r.idleFor = 10 * time.Millisecond
	done := make(chan struct{})
	r.run(func() { close(done) })
	<-done
	until(t, "the runner to wait for work", func() bool { return r.idle.Load() == 1 })
	until(t, "the idle runner to exit", func() bool { return r.idle.Load() == 0 })
	// The next piece of work starts a new one.
	done = make(chan struct{})
	r.run(func() { close(done) })
	<-done
	if n := r.started.Load(); n != 2 {
		t.Fatalf("%d runners started, want 2: the first had exited", n)
	}
}
