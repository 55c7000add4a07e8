package e2e

import (
	"bytes"
	"context"
	"crypto"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/nats-io/nats.go"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers/converge"
	"github.com/steward-dev/steward/workers/join"
	"github.com/steward-dev/steward/workers/provision"
	"github.com/steward-dev/steward/workers/workertest"
)

// loadProject loads compose files with the compose specification's own
// loader, as `docker compose` does, with an empty environment so every
// default in the file applies.
func loadProject(t testing.TB, files ...string) *types.Project {
	t.Helper()
	return loadProjectWith(t, nil, files...)
}

// loadProjectWith is loadProject with the given environment, as .env sets it.
func loadProjectWith(t testing.TB, env []string, files ...string) *types.Project {
	t.Helper()
	return loadProjectIn(t, repoRoot, env, files...)
}

// loadProjectIn loads compose files (named from the repository's root) with
// dir as the project folder, which relative paths in them are resolved
// against: `docker compose -f deploy/sites/compose.sites.yaml` takes the
// first file's folder.
func loadProjectIn(t testing.TB, dir string, env []string, files ...string) *types.Project {
	t.Helper()
	var paths []string
	for _, f := range files {
		paths = append(paths, filepath.Join(repoRoot, f))
	}
	opts, err := cli.NewProjectOptions(paths,
		cli.WithWorkingDirectory(dir),
		cli.WithEnv(env),
		cli.WithInterpolation(true),
		cli.WithResolvedPaths(true),
	)
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("load %v: %v", files, err)
	}
	return p
}

// composeRun runs a compose project's services as local processes: the
// Steward services and NATS with exactly their declared command and
// environment, PostgreSQL as a private instance. What only exists inside
// Docker is mapped: service host names to 127.0.0.1, container ports to
// free ports, volumes to folders of the test.
type composeRun struct {
	t       *testing.T
	p       *types.Project
	pg      *postgres
	work    string
	ports   map[string]map[int]int
	volumes map[string]string
	procs   map[string]*proc
	// restarts counts the restarts the services' restart policy made.
	restarts int
}

func newComposeRun(t *testing.T, p *types.Project) *composeRun {
	return &composeRun{t: t, p: p, work: t.TempDir(), ports: map[string]map[int]int{}, volumes: map[string]string{}, procs: map[string]*proc{}}
}

func isPostgres(s types.ServiceConfig) bool { return strings.HasPrefix(s.Image, "postgres:") }
func isNATS(s types.ServiceConfig) bool     { return strings.HasPrefix(s.Image, "nats:") }
func isSteward(s types.ServiceConfig) bool  { return s.Build != nil }

// hostPort is where the test runs a service's container port.
func (r *composeRun) hostPort(service string, port int) int {
	if r.ports[service] == nil {
		r.ports[service] = map[int]int{}
	}
	if p, ok := r.ports[service][port]; ok {
		return p
	}
	p := workertest.FreePort(r.t)
	r.ports[service][port] = p
	return p
}

// hostPortRe finds host:port pairs: a service's name, a listen address
// (":9090", "0.0.0.0:4222") or the service's own loopback.
var hostPortRe = regexp.MustCompile(`([A-Za-z0-9_.-]*):([0-9]{2,5})\b`)

// mapAddrs rewrites the addresses in s as seen from service.
func (r *composeRun) mapAddrs(service, s string) string {
	return hostPortRe.ReplaceAllStringFunc(s, func(m string) string {
		sub := hostPortRe.FindStringSubmatch(m)
		host, port := sub[1], sub[2]
		n, _ := strconv.Atoi(port)
		target := ""
		switch {
		case host == "" || host == "0.0.0.0" || host == "127.0.0.1" || host == "localhost":
			target = service
		default:
			if _, ok := r.p.Services[host]; ok {
				target = host
			}
		}
		if target == "" {
			return m
		}
		return fmt.Sprintf("127.0.0.1:%d", r.hostPort(target, n))
	})
}

// mounts returns a service's volume targets and the folders or files they
// are here, longest target first.
func (r *composeRun) mounts(svc types.ServiceConfig) [][2]string {
	var out [][2]string
	for _, v := range svc.Volumes {
		out = append(out, [2]string{v.Target, r.volume(svc.Name, v)})
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i][0]) > len(out[j][0]) })
	return out
}

// volume maps one volume: a named volume to a folder shared by every
// service that mounts it; a bind mount to a copy of its source (files
// rewritten like the environment), so the test never writes into the
// repository.
func (r *composeRun) volume(service string, v types.ServiceVolumeConfig) string {
	t := r.t
	key := v.Type + ":" + v.Source
	if v.Type == types.VolumeTypeBind {
		key += ":" + service
	}
	if dir, ok := r.volumes[key]; ok {
		return dir
	}
	dest := filepath.Join(r.work, "volumes", strings.NewReplacer("/", "_", ":", "_").Replace(key))
	switch v.Type {
	case types.VolumeTypeVolume:
		if err := os.MkdirAll(dest, 0o755); err != nil {
			t.Fatal(err)
		}
	case types.VolumeTypeBind:
		fi, err := os.Stat(v.Source)
		switch {
		case os.IsNotExist(err):
			if err := os.MkdirAll(dest, 0o755); err != nil {
				t.Fatal(err)
			}
		case err != nil:
			t.Fatal(err)
		case fi.IsDir():
			if err := os.CopyFS(dest, os.DirFS(v.Source)); err != nil {
				t.Fatal(err)
			}
		default:
			raw, err := os.ReadFile(v.Source)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
				t.Fatal(err)
			}
			dest = filepath.Join(dest+".d", filepath.Base(v.Source))
			if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
				t.Fatal(err)
			}
			// The file is read inside the container with the container's
			// names for ports and folders; here it gets this run's.
			r.volumes[key] = dest
			text := r.mapAddrs(service, string(raw))
			for _, m := range r.mountsOf(service, v.Target) {
				text = strings.ReplaceAll(text, `"`+m[0]+`"`, `"`+m[1]+`"`)
				text = strings.ReplaceAll(text, `"`+m[0]+`/`, `"`+m[1]+`/`)
			}
			if err := os.WriteFile(dest, []byte(text), fi.Mode().Perm()); err != nil {
				t.Fatal(err)
			}
		}
	default:
		t.Fatalf("service %s: volume type %s is not mapped by this test", service, v.Type)
	}
	r.volumes[key] = dest
	return dest
}

// mountsOf is mounts without the one being mapped (a file does not name
// its own mount point).
func (r *composeRun) mountsOf(service, except string) [][2]string {
	var out [][2]string
	for _, m := range r.mounts(r.p.Services[service]) {
		if m[0] != except {
			out = append(out, m)
		}
	}
	return out
}

// mapValue rewrites one argument or environment value for service:
// addresses, then paths under its mounts.
func (r *composeRun) mapValue(service, s string) string {
	s = r.mapAddrs(service, s)
	for _, m := range r.mounts(r.p.Services[service]) {
		if s == m[0] || strings.HasPrefix(s, m[0]+"/") {
			return m[1] + strings.TrimPrefix(s, m[0])
		}
	}
	return s
}

// env is the service's declared environment, mapped.
func (r *composeRun) env(svc types.ServiceConfig) map[string]string {
	out := map[string]string{}
	for k, v := range svc.Environment {
		if v != nil {
			out[k] = r.mapValue(svc.Name, *v)
		}
	}
	return out
}

// declared returns a declared environment variable of a service, unmapped.
func (r *composeRun) declared(service, name string) string {
	v := r.p.Services[service].Environment[name]
	if v == nil {
		r.t.Fatalf("service %s declares no %s", service, name)
	}
	return *v
}

// order lists the services so that each comes after what it depends on.
func (r *composeRun) order() []string {
	var out []string
	seen := map[string]bool{}
	var visit func(string)
	visit = func(name string) {
		if seen[name] {
			return
		}
		seen[name] = true
		for _, dep := range slices.Sorted(mapKeys(r.p.Services[name].DependsOn)) {
			visit(dep)
		}
		out = append(out, name)
	}
	for _, name := range slices.Sorted(mapKeys(r.p.Services)) {
		visit(name)
	}
	return out
}

func mapKeys[M ~map[string]V, V any](m M) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// start starts every service in dependency order, honouring each
// dependency's condition.
func (r *composeRun) start() {
	t := r.t
	for _, name := range r.order() {
		svc := r.p.Services[name]
		for _, dep := range slices.Sorted(mapKeys(svc.DependsOn)) {
			r.waitCondition(dep, svc.DependsOn[dep].Condition)
		}
		switch {
		case isPostgres(svc) && r.pg != nil:
			r.pg.start(t)
		case isPostgres(svc):
			// The private instance stands in; its port is the service's.
			r.pg = startPostgres(t)
			if r.ports[name] == nil {
				r.ports[name] = map[int]int{}
			}
			r.ports[name][5432] = r.pg.port
		case r.procs[name] != nil:
			r.procs[name].start()
		case isNATS(svc):
			args := r.args(svc)
			p := newProc(t, "compose-"+name, bins.nats, args, nil)
			p.start()
			r.procs[name] = p
		case isSteward(svc):
			program, args := bins.steward, r.args(svc)
			if len(svc.Entrypoint) > 0 {
				program, args = r.mapValue(name, svc.Entrypoint[0]), append(r.mapValues(name, svc.Entrypoint[1:]), args...)
			}
			p := newProc(t, "compose-"+name, program, args, envList(r.env(svc)))
			p.start()
			r.procs[name] = p
		default:
			t.Fatalf("service %s (image %s) is neither Steward's, NATS nor PostgreSQL: this test does not know how to run it", name, svc.Image)
		}
	}
}

// stop stops every service, dependents first, as `docker compose stop`
// does (SIGTERM, then SIGKILL after the stop grace period); the volumes
// stay.
func (r *composeRun) stop() {
	order := r.order()
	slices.Reverse(order)
	for _, name := range order {
		if isPostgres(r.p.Services[name]) {
			r.pg.stop(r.t)
			continue
		}
		p := r.procs[name]
		if !p.running() {
			continue
		}
		p.signal(syscall.SIGTERM)
		grace := 10 * time.Second
		if g := r.p.Services[name].StopGracePeriod; g != nil {
			grace = time.Duration(*g)
		}
		if _, ok := p.wait(grace); !ok {
			r.t.Errorf("service %s still running %v after SIGTERM; Docker would SIGKILL it", name, grace)
			p.kill()
		}
	}
}

func (r *composeRun) args(svc types.ServiceConfig) []string {
	return r.mapValues(svc.Name, svc.Command)
}

func (r *composeRun) mapValues(service string, list []string) []string {
	out := make([]string, len(list))
	for i, s := range list {
		out[i] = r.mapValue(service, s)
	}
	return out
}

// waitCondition waits for a depends_on condition.
func (r *composeRun) waitCondition(name, condition string) {
	t := r.t
	switch condition {
	case types.ServiceConditionHealthy:
		r.waitHealthy(name)
	case types.ServiceConditionCompletedSuccessfully:
		p := r.procs[name]
		exit, ok := p.wait(time.Minute)
		if !ok || exit != nil {
			t.Fatalf("service %s did not complete successfully (%v):\n%s", name, exit, p.tail(30))
		}
	case types.ServiceConditionStarted, "":
	default:
		t.Fatalf("depends_on condition %q is not known to this test", condition)
	}
}

// healthURL is the URL the service's healthcheck fetches, mapped.
func (r *composeRun) healthURL(name string) string {
	hc := r.p.Services[name].HealthCheck
	if hc == nil {
		return ""
	}
	for _, a := range hc.Test {
		if strings.HasPrefix(a, "http://") {
			return r.mapAddrs(name, a)
		}
	}
	return ""
}

// waitHealthy waits until a service passes its own healthcheck: the URL it
// fetches, or for PostgreSQL, a query.
func (r *composeRun) waitHealthy(name string) {
	t := r.t
	if isPostgres(r.p.Services[name]) {
		if err := r.pg.ping(); err != nil {
			t.Fatalf("postgres: %v", err)
		}
		return
	}
	url := r.healthURL(name)
	if url == "" {
		t.Fatalf("service %s is depended on as healthy but has no HTTP healthcheck this test can run", name)
	}
	p := r.procs[name]
	waitFor(t, "service "+name+" is healthy", 2*time.Minute, func() (bool, string) {
		if gone, err := p.exited(); gone {
			if !r.restart(name) {
				t.Fatalf("service %s exited: %v\n%s", name, err, p.tail(30))
			}
			return false, fmt.Sprintf("exited (%v); restarting as its restart policy says", err)
		}
		return httpOK(url)
	})
}

// restart does what Docker does for a service that exited with a restart
// policy (unless-stopped, always, on-failure): it starts it again, 100ms
// after it exited. It reports false when the policy says to leave it.
func (r *composeRun) restart(name string) bool {
	p := r.procs[name]
	switch r.p.Services[name].Restart {
	case types.RestartPolicyUnlessStopped, types.RestartPolicyAlways, types.RestartPolicyOnFailure:
	default:
		return false
	}
	p.mu.Lock()
	since := time.Since(p.exitedAt)
	p.mu.Unlock()
	if since >= 100*time.Millisecond {
		r.t.Logf("service %s exited; restarted by its restart policy (%s)", name, r.p.Services[name].Restart)
		p.start()
		r.restarts++
	}
	return true
}

// mountPath is where a service's mount target is in this run.
func (r *composeRun) mountPath(service, target string) string {
	return r.mapValue(service, target)
}

// flagRe finds the long flags in a command's --help.
var flagRe = regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9-]+)`)

// unknownSettings lists the STEWARD_* variables a service sets that are not
// the environment twin of one of its command's flags. steward ignores
// those silently, so a misspelt setting would pass unnoticed.
func (r *composeRun) unknownSettings(name string) []string {
	svc := r.p.Services[name]
	out := runSteward(r.t, nil, append(slices.Clone(svc.Command), "--help")...)
	twins := map[string]bool{}
	for _, m := range flagRe.FindAllStringSubmatch(out, -1) {
		twins["STEWARD_"+strings.ToUpper(strings.ReplaceAll(m[1], "-", "_"))] = true
	}
	var unknown []string
	for k := range svc.Environment {
		if strings.HasPrefix(k, "STEWARD_") && !twins[k] {
			unknown = append(unknown, k)
		}
	}
	slices.Sort(unknown)
	return unknown
}

// runOneShot runs a service that `up` leaves out (its profile is not
// active), as `docker compose run --rm <name> [args]` does: its declared
// command unless args are given, its environment and volumes mapped, and
// returns what it printed. The service must exit 0 within a minute.
func (r *composeRun) runOneShot(name string, args []string) string {
	t := r.t
	t.Helper()
	svc, ok := r.p.DisabledServices[name]
	if !ok {
		t.Fatalf("compose declares no on-demand %s service (one a profile keeps out of `up`)", name)
	}
	if _, ok := r.p.Services[name]; !ok {
		// Mapping reads the service's mounts from the running set.
		r.p.Services[name] = svc
		defer delete(r.p.Services, name)
	}
	if unknown := r.unknownSettings(name); len(unknown) > 0 {
		t.Errorf("service %s sets %v, which are no flag's twin of `steward %s`", name, unknown, strings.Join(svc.Command, " "))
	}
	if r.declared(name, "STEWARD_NATS_CREDS") == "" {
		t.Errorf("service %s has no STEWARD_NATS_CREDS: the bus is closed", name)
	}
	cmd := r.args(svc)
	if args != nil {
		cmd = r.mapValues(name, args)
	}
	p := newProc(t, "compose-"+name+"-"+strings.Join(args, "-"), bins.steward, cmd, envList(r.env(svc)))
	p.start()
	exit, done := p.wait(time.Minute)
	out := p.tail(200)
	if !done || exit != nil {
		t.Fatalf("docker compose run --rm %s %s: exit %v (done %v):\n%s", name, strings.Join(args, " "), exit, done, out)
	}
	return out
}

// post sends one event to the ingress in structured mode.
func (r *composeRun) post(url, token string, e event.Event) publisher.Ack {
	t := r.t
	body, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/cloudevents+json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out publisher.IngressResponse
	if resp.StatusCode != http.StatusAccepted || json.Unmarshal(raw, &out) != nil || len(out.Events) != 1 {
		t.Fatalf("POST %s %s: %s %s", url, e.Type(), resp.Status, raw)
	}
	return out.Events[0]
}

// TestCompose runs compose.yaml as local processes and publishes one event
// of each kind through its HTTP ingress: each gets its outcome, and what the
// workers write lands in the volumes compose declares. Then everything is
// stopped and started again on the same volumes, and the same changes sent
// again find their state kept. The cluster variant adds
// deploy/cluster/compose.cluster.yaml: three NATS nodes, R3 streams.
// TestComposePortsAvoidAMachinesNATS checks where compose publishes its
// ports on the host: by default not 4222 and 8222, which a machine's own
// NATS often holds (compose would fail to start beside it), and wherever
// .env says.
func TestComposePortsAvoidAMachinesNATS(t *testing.T) {
	published := func(p *types.Project) map[string][]string {
		out := map[string][]string{}
		for _, name := range []string{"nats", "ingress"} {
			for _, port := range p.Services[name].Ports {
				out[name] = append(out[name], port.Published)
			}
		}
		return out
	}
	got := published(loadProject(t, "compose.yaml"))
	if want := []string{"4322", "8322"}; !slices.Equal(got["nats"], want) {
		t.Errorf("NATS is published on %v by default; want %v", got["nats"], want)
	}
	if want := []string{"8080"}; !slices.Equal(got["ingress"], want) {
		t.Errorf("the ingress is published on %v by default; want %v", got["ingress"], want)
	}
	got = published(loadProjectWith(t, []string{"STEWARD_NATS_PORT=14222", "STEWARD_NATS_MONITOR_PORT=18222", "STEWARD_INGRESS_PORT=18080"}, "compose.yaml"))
	if want := []string{"14222", "18222"}; !slices.Equal(got["nats"], want) {
		t.Errorf("with STEWARD_NATS_PORT=14222 and STEWARD_NATS_MONITOR_PORT=18222, NATS is published on %v; want %v", got["nats"], want)
	}
	if want := []string{"18080"}; !slices.Equal(got["ingress"], want) {
		t.Errorf("with STEWARD_INGRESS_PORT=18080, the ingress is published on %v; want %v", got["ingress"], want)
	}
}

func TestCompose(t *testing.T) {
	for _, tc := range []struct {
		name       string
		files      []string
		replicas   int
		nats       int
		restartAll bool
	}{
		{"single", []string{"compose.yaml"}, 1, 1, true},
		{"cluster", []string{"compose.yaml", "deploy/cluster/compose.cluster.yaml"}, 3, 3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testCompose(t, tc.name, tc.files, tc.replicas, tc.nats, tc.restartAll)
		})
	}
}

func testCompose(t *testing.T, name string, files []string, replicas, natsNodes int, restartAll bool) {
	p := loadProject(t, files...)
	r := newComposeRun(t, p)

	// stewardNames are the long-running Steward services; oneShots the
	// steward commands that run once and exit (setup), whose settings are
	// checked like the others'.
	var natsNames, stewardNames, oneShots []string
	for _, name := range slices.Sorted(mapKeys(p.Services)) {
		s := p.Services[name]
		switch {
		case isNATS(s):
			natsNames = append(natsNames, name)
		case isSteward(s) && len(s.Entrypoint) == 0 && s.Restart == types.RestartPolicyNo:
			oneShots = append(oneShots, name)
		case isSteward(s) && len(s.Entrypoint) == 0:
			stewardNames = append(stewardNames, name)
		}
	}
	if !slices.Contains(oneShots, "setup") {
		t.Fatalf("compose declares no one-shot setup service (one-shot Steward commands: %v): workers may not create the streams", oneShots)
	}
	for _, want := range []string{"converge", "join", "credential", "provision", "ingress"} {
		if !slices.Contains(stewardNames, want) {
			t.Fatalf("compose declares no %s service (Steward services: %v)", want, stewardNames)
		}
	}
	if len(natsNames) != natsNodes {
		t.Fatalf("%d NATS services %v; want %d", len(natsNames), natsNames, natsNodes)
	}
	for _, name := range append(slices.Clone(stewardNames), oneShots...) {
		if got := r.declared(name, "STEWARD_REPLICAS"); got != strconv.Itoa(replicas) {
			t.Errorf("%s: STEWARD_REPLICAS=%s; want %d", name, got, replicas)
		}
	}

	for _, name := range append(slices.Clone(stewardNames), oneShots...) {
		if r.declared(name, "STEWARD_NATS_CREDS") == "" {
			t.Errorf("service %s has no STEWARD_NATS_CREDS: the bus is closed", name)
		}
		if unknown := r.unknownSettings(name); len(unknown) > 0 {
			t.Errorf("service %s sets %v, which are no flag's twin of `steward %s`: steward would ignore them", name, unknown, strings.Join(p.Services[name].Command, " "))
		}
	}

	start := time.Now()
	r.start()
	for _, name := range stewardNames {
		r.waitHealthy(name)
	}
	upIn := time.Since(start)

	// The test reads the bus as the operator, with setup's credentials.
	b := connect(t, r.mapAddrs("converge", r.declared("converge", "STEWARD_NATS_URL")), nats.UserCredentials(r.env(p.Services["setup"])["STEWARD_NATS_CREDS"]))
	r.closedBus(b.nc.ConnectedUrl())
	for _, s := range []string{events.StreamEvents, events.StreamOutcomes, events.StreamDLQ, "KV_" + events.CheckpointBucket} {
		got, err := streamReplicas(b, s)
		if err != nil || got != replicas {
			t.Errorf("stream %s has %d replicas (%v); want %d", s, got, err, replicas)
		}
	}

	keys := r.mountPath("keys", "/keys")
	signer := func(name string) crypto.Signer {
		load := signing.LoadPrivateKey
		if name == "cosign" {
			// The keys service seals the release key in cosign's own
			// format, with an empty password (COSIGN_PASSWORD unset).
			load = func(path string) (crypto.Signer, error) { return converge.LoadReleaseSigner(path, nil) }
		}
		s, err := load(filepath.Join(keys, name+".key"))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	token, err := os.ReadFile(filepath.Join(keys, "ingress-token"))
	if err != nil {
		t.Fatal(err)
	}
	// Rotations and grants are signed by the ingress only for the scoped
	// token the keys service issued for this hive and machine.
	scoped, err := os.ReadFile(filepath.Join(keys, "scoped-token"))
	if err != nil {
		t.Fatal(err)
	}
	tokenFor := func(e event.Event) string {
		if e.Type() == events.TypeCredentialRotated || e.Type() == events.TypeGrantChanged {
			return strings.TrimSpace(string(scoped))
		}
		return strings.TrimSpace(string(token))
	}
	ingressPort := int(p.Services["ingress"].Ports[0].Target)
	ingress := fmt.Sprintf("http://127.0.0.1:%d%s", r.hostPort("ingress", ingressPort), publisher.IngressPath)
	newEvent := func(typ, key string, data any) event.Event {
		e, err := events.New(typ, key, data)
		if err != nil {
			t.Fatal(err)
		}
		e.SetSource("/steward/e2e/compose")
		return e
	}

	// converge: a release signed with the key compose's converge trusts, in
	// the registry folder it reads.
	install := r.declared("converge", "STEWARD_INSTALL")
	registry := r.env(p.Services["converge"])["STEWARD_REGISTRY"]
	sum := make([]byte, 32)
	if err := converge.WriteRelease(registry, signer("cosign"), converge.Manifest{
		Schema: converge.ManifestSchema, Version: "1.1.0", MinFromVersion: r.declared("converge", "STEWARD_INSTALLED_VERSION"),
		OpsImage: "ghcr.io/steward-dev/steward-ops@sha256:" + hex.EncodeToString(sum), PublishedAt: time.Now().UTC().Format(time.RFC3339),
	}); err != nil {
		t.Fatal(err)
	}
	release := newEvent(events.TypeReleasePublished, "1.1.0", events.ReleasePublished{Version: "1.1.0"})

	// join: the host floor, then an invitation for the box's identity record.
	joinEnv := r.env(p.Services["join"])
	box, deployment := joinEnv["STEWARD_BOX"], joinEnv["STEWARD_DEPLOYMENT"]
	floorData, err := join.SignHostFloor(signer("release"), events.HostFloor{V: 1, Deployment: deployment, MinAgentVersion: "1.0.0", Binaries: []string{strings.Repeat("cd", 32)}})
	if err != nil {
		t.Fatal(err)
	}
	floor := newEvent(events.TypeHostFloorPublished, deployment, floorData)
	evidence, err := join.EvidenceOf(joinEnv["STEWARD_IDENTITY_RECORD"])
	if err != nil {
		t.Fatal(err)
	}
	invData, err := join.SignInvitation(signer("console"), events.Invitation{V: 1, Deployment: deployment, Box: box, Enrollment: "enr-compose-1", EvidenceSHA256: evidence, IssuedAt: time.Now().UTC().Truncate(time.Second).Format(time.RFC3339)})
	if err != nil {
		t.Fatal(err)
	}
	invitation := newEvent(events.TypeInvitationWritten, box, invData)

	// credential: version 1 of the hive's credential, encrypted to it.
	hive := r.declared("credential", "STEWARD_HIVE")
	rotated := newEvent(events.TypeCredentialRotated, hive, events.CredentialRotated{
		Hive: hive, Version: 1, ClientID: "compose-client-1",
		Secret: encryptTo(t, recipientOf(t, filepath.Join(keys, "hive.pub")), "compose-secret-1"),
	})

	// provision: one consumer with a database, its password encrypted to
	// the machine.
	machine := r.declared("provision", "STEWARD_MACHINE")
	granted := grant(t, "", recipientOf(t, filepath.Join(keys, "machine.pub")), machine, 1, "compose_app")

	type check struct {
		worker, instance string
		e                event.Event
		outcome          string
	}
	checks := []check{
		{"converge", install, release, "succeeded"},
		{"join", box, floor, "floor-accepted"},
		{"join", box, invitation, "armed"},
		{"credential", hive, rotated, "applied"},
		{"provision", machine, granted, "applied"},
	}
	published := time.Now()
	ids := map[int]string{}
	for i, c := range checks {
		ids[i] = r.post(ingress, tokenFor(c.e), c.e).ID
	}
	outcomesOK := 0
	var handledIn time.Duration
	for i, c := range checks {
		// Two minutes: on the three-node cluster just started, one of the
		// five events now and then takes 25-55 s (seen in 2 of about 10
		// runs on 2026-12-03, a different worker each time, and in 1 of 5
		// at 11f5af6, before the engine redesign), not yet explained;
		// every other time each takes under half a second.
		o := waitOutcome(t, b, c.worker, c.instance, ids[i], 2*time.Minute)
		// The worker stamps the outcome when it emits it.
		handledIn = max(handledIn, o.Time().Sub(published))
		t.Logf("%s: %s, emitted %v after the post", c.e.Type(), o.Type(), round(o.Time().Sub(published)))
		if want := "dev.steward." + outcomeNoun(c.worker) + "." + c.outcome + ".v1"; o.Type() != want {
			t.Errorf("%s: outcome %s (%s); want %s", c.e.Type(), o.Type(), o.Data(), want)
			continue
		}
		outcomesOK++
	}

	// What the workers wrote is in the volumes compose keeps.
	credDir := r.env(p.Services["credential"])["STEWARD_CREDENTIAL_DIR"]
	if raw, err := os.ReadFile(filepath.Join(credDir, "client_id")); err != nil || strings.TrimSpace(string(raw)) != "compose-client-1" {
		t.Errorf("credential volume: client_id %q (%v)", raw, err)
	}
	if fi, err := os.Stat(filepath.Join(credDir, "secret")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("credential volume: secret %v (%v); want mode 0600", fi, err)
	}
	marker, err := os.ReadFile(joinEnv["STEWARD_ARMED_MARKER"])
	if err != nil || !strings.Contains(string(marker), "enr-compose-1") {
		t.Errorf("join volume: armed marker %q (%v)", marker, err)
	}
	if _, err := os.Stat(join.EnrollmentPath(joinEnv["STEWARD_OPT_DIR"])); err != nil {
		t.Errorf("join volume: %v", err)
	}
	if roles := r.pg.query(t, `SELECT rolname FROM pg_roles WHERE rolname = 'mesh_compose_app' AND rolcanlogin`); len(roles) != 1 {
		t.Errorf("postgres: role mesh_compose_app with login missing (%v)", roles)
	}
	dead := 0
	for _, c := range checks {
		dead += len(b.deadLetters(t, c.worker, c.instance))
	}
	if dead != 0 {
		t.Errorf("%d dead letters; want none", dead)
	}
	for _, name := range stewardNames {
		if gone, err := r.procs[name].exited(); gone {
			t.Errorf("service %s exited: %v", name, err)
		}
	}

	// The operator's tools, as `docker compose run --rm ops status` and
	// `... ops dlq ls` run them: the ops service's declared command and
	// environment, with the operator's credentials. (The ingress's are a
	// publisher's: status run there is refused.)
	opsOut := r.runOneShot("ops", nil)
	for _, c := range checks {
		if !strings.Contains(opsOut, c.instance) {
			t.Errorf("docker compose run --rm ops status does not list instance %s:\n%s", c.instance, opsOut)
		}
	}
	r.runOneShot("ops", []string{"dlq", "ls"})

	// The box's own credentials, as an attacker holding them would use
	// them: reflect direct gets of its own key into the credential's and
	// the provision's checkpoints, each claiming a sequence far beyond the
	// stream (docs/design.md §7). The next signed rotation and grant apply
	// all the same.
	skip := `{"applied":1000000000}`
	attacks := reflectAsBox(t, b, r.env(p.Services["join"])["STEWARD_NATS_CREDS"], box, map[string]string{
		events.CheckpointKey("credential", hive, events.TypeCredentialRotated, hive): skip,
		events.CheckpointKey("provision", machine, events.TypeGrantChanged, machine): skip,
	})
	rotated2 := newEvent(events.TypeCredentialRotated, hive, events.CredentialRotated{
		Hive: hive, Version: 2, ClientID: "compose-client-2",
		Secret: encryptTo(t, recipientOf(t, filepath.Join(keys, "hive.pub")), "compose-secret-2"),
	})
	granted2 := grant(t, "", recipientOf(t, filepath.Join(keys, "machine.pub")), machine, 2, "compose_app")
	withstood := 0
	for _, c := range []check{{"credential", hive, rotated2, "applied"}, {"provision", machine, granted2, "applied"}} {
		id := r.post(ingress, tokenFor(c.e), c.e).ID
		o := waitOutcome(t, b, c.worker, c.instance, id, time.Minute)
		if want := "dev.steward." + outcomeNoun(c.worker) + "." + c.outcome + ".v1"; o.Type() != want {
			t.Errorf("after the box forged %s's checkpoint: outcome %s (%s); want %s", c.worker, o.Type(), o.Data(), want)
			continue
		}
		withstood++
	}
	if raw, err := os.ReadFile(filepath.Join(credDir, "client_id")); err != nil || strings.TrimSpace(string(raw)) != "compose-client-2" {
		t.Errorf("after the forgery, client_id %q (%v); want version 2 applied", raw, err)
	}

	// What must survive a restart does: stop everything, start it again
	// on the same volumes, and send the same changes again under new ids.
	// Each worker finds its state where compose keeps it and does nothing.
	restartedIn, kept := time.Duration(0), 0
	if restartAll {
		r.stop()
		begin := time.Now()
		r.start()
		for _, name := range stewardNames {
			r.waitHealthy(name)
		}
		restartedIn = time.Since(begin)
		again := []check{
			// The installed version is in the checkpoint bucket (nats-data).
			{"converge", install, release, "refused"},
			// The marker is in join-opt.
			{"join", box, invitation, "armed-already"},
			// The files are in credentials.
			{"credential", hive, rotated2, "skipped"},
			// The applied generation is in PostgreSQL (pg-data).
			{"provision", machine, granted2, "skipped"},
		}
		for i, c := range again {
			e := c.e.Clone()
			e.SetID(fmt.Sprintf("after-restart-%d", i))
			var id string
			if e.Type() == events.TypeCredentialRotated || e.Type() == events.TypeGrantChanged {
				// The same version again is outside every token's window
				// (the ingress signs only a step up), so the controller
				// signs it itself, as from its own source of truth.
				signed, err := signing.SignEvent(signer("controller"), e)
				if err != nil {
					t.Fatal(err)
				}
				ack, err := b.pub.Publish(context.Background(), signed)
				if err != nil {
					t.Fatal(err)
				}
				id = ack.ID
			} else {
				id = r.post(ingress, tokenFor(e), e).ID
			}
			o := waitOutcome(t, b, c.worker, c.instance, id, time.Minute)
			if want := "dev.steward." + outcomeNoun(c.worker) + "." + c.outcome + ".v1"; o.Type() != want {
				t.Errorf("after the restart, %s again: outcome %s (%s); want %s", c.e.Type(), o.Type(), o.Data(), want)
				continue
			}
			kept++
		}
	}

	figures := []any{"services", len(p.Services), "steward_services", len(stewardNames), "nats_nodes", len(natsNames), "replicas", replicas,
		"events", len(checks), "outcomes_ok", outcomesOK, "dead_lettered", dead, "lost", len(checks) - outcomesOK,
		"policy_restarts", r.restarts, "up_in", round(upIn), "handled_in", round(handledIn),
		"forgeries_reflected", attacks, "forgeries_withstood", fmt.Sprintf("%d/2", withstood)}
	if restartAll {
		figures = append(figures, "full_restart_ready_in", round(restartedIn), "state_kept", fmt.Sprintf("%d/4", kept))
	}
	summary(t, "compose-"+name, figures...)
}

// closedBus proves compose's NATS refuses a client without credentials.
func (r *composeRun) closedBus(url string) {
	nc, err := nats.Connect(url)
	if err == nil {
		nc.Close()
		r.t.Errorf("compose's NATS at %s accepted a connection without credentials", url)
	}
}

// outcomeNoun is the word a worker's outcome types start with: the
// provision worker's are grant.applied and grant.refused.
func outcomeNoun(worker string) string {
	if worker == provision.Name {
		return provision.OutcomeNoun
	}
	return worker
}
