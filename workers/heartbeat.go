package workers

import "time"

// heartbeats marks every held message in progress, so a short AckWait and a
// long handler (or a long queue behind one key, or a key retrying for as
// long as its dependency is down) live together; it lets lanes stop
// waiting for an earlier event that did not come back in time, and
// publishes the status of retrying and waiting keys: every status
// interval, and at once when a key that was retrying settles. It returns once the
// worker has stopped and every lane and confirmation is done.
func (w *Runtime) heartbeats(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(w.o.heartbeat)
	defer t.Stop()
	var lastStatus time.Time
	for {
		select {
		case <-stop:
			w.publishStatus(true)
			return
		case <-w.statusNow:
			lastStatus = w.now()
			w.publishStatus(false)
			continue
		case <-t.C:
		}
		msgs, claimed, now := w.queue.tick()
		for _, l := range claimed {
			w.runners.run(w.laneRun(l))
		}
		for _, m := range msgs {
			_ = m.InProgress()
		}
		if now.Sub(lastStatus) >= w.o.statusInterval {
			lastStatus = now
			w.publishStatus(false)
		}
	}
}
