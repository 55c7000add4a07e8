// Package e2e runs Steward for real and breaks it: the steward binary and
// nats-server are built once and started as processes, PostgreSQL runs as a
// private instance from the machine's binaries, and each test states an
// invariant and checks it.
//
//   - TestCompose loads compose.yaml with the compose specification's Go
//     loader and runs every Steward service with exactly its declared command
//     and environment (host names, ports and volumes mapped to this machine),
//     then publishes one event of each kind through the HTTP ingress and
//     checks each outcome. The compose file cannot drift from what works.
//   - TestFaultWorkerKilled: a worker killed with SIGKILL at random points
//     while 1,000 events for 50 keys flow ends in the same state as a worker
//     never killed; nothing is lost, applied twice or rolled back.
//   - TestFaultNATSRestart: the NATS server restarted with SIGTERM and then
//     SIGKILL mid-stream; the worker reconnects and finishes and nothing
//     acknowledged is lost (sync_interval: always).
//   - TestFaultClusterLeaderKilled: a three-node cluster with R3 streams and
//     KV; the stream leader is killed mid-stream; nothing is lost.
//   - TestFaultPostgresRestart: PostgreSQL stopped and started while a grant
//     is being provisioned; the grant completes after it returns, and the
//     retries show in the worker's metrics.
//   - TestFaultMalformedFlood: malformed events interleaved with valid ones;
//     every bad one is in the DLQ with a reason, every valid one is handled,
//     and the stream never stalls.
//
// Each test logs its figures and prints one plain summary line starting with
// "e2e summary:". Run them with:
//
//	go test -count=1 -v ./e2e/
//
// They need Go, /bin/sh and PostgreSQL 15's server binaries
// (/usr/lib/postgresql/15/bin, or STEWARD_E2E_PG_BIN), and they run as root
// or as a user who may start PostgreSQL (as root the instance runs as the
// postgres user).
package e2e
