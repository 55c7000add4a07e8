package workers

import (
	"testing"
	"time"
)

// handOver gives f to a runner that is waiting for work, failing the test
// if none takes it within a deadline: only a runner receives from work.
func handOver(t *testing.T, r *runners, f func()) {
	t.Helper()
	select {
	case r.work <- f:
	case <-time.After(5 * time.Second):
		t.Fatal("no runner took the work within 5s")
	}
}

func TestARunnerThatFinishedTakesTheNextWork(t *testing.T) {
	r := newRunners()
	for i := range 3 {
		done := make(chan struct{})
		if i == 0 {
			r.run(func() { close(done) })
		} else {
			handOver(t, r, func() { close(done) })
		}
		<-done
	}
	if n := r.started.Load(); n != 1 {
		t.Fatalf("three pieces of work one after the other started %d runners, want 1: the finished runner takes the next", n)
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
	exited := make(chan struct{})
	go func() { r.live.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("the idle runner did not exit within 5s of its idle time of 10ms")
	}
	// The next piece of work starts a new one.
	done = make(chan struct{})
	r.run(func() { close(done) })
	<-done
	if n := r.started.Load(); n != 2 {
		t.Fatalf("%d runners started, want 2: the first had exited", n)
	}
}
