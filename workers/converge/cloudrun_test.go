package converge

import (
	"context"
	"testing"
	"time"

	"cloud.google.com/go/iam/apiv1/iampb"
	"cloud.google.com/go/run/apiv2/runpb"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/converge/cloudrunfake"
	"github.com/steward-dev/steward/workers/workertest"
)

// wantJob is the job, exactly, that converge asks Cloud Run for.
// Its executions also carry the event they were started for (label and
// annotation) and the exact version.
func wantJob(versionLabel, version, eventID, img string) *runpb.Job {
	labels := map[string]string{"steward-install": "shop", "steward-version": versionLabel, "managed-by": "steward"}
	execLabels := map[string]string{"steward-install": "shop", "steward-version": versionLabel, "managed-by": "steward", "steward-event": labelValue(eventID)}
	return &runpb.Job{
		Labels: labels,
		Template: &runpb.ExecutionTemplate{
			Labels:      execLabels,
			Annotations: map[string]string{"steward.dev/event-id": eventID, "steward.dev/version": version},
			TaskCount:   1,
			Parallelism: 1,
			Template: &runpb.TaskTemplate{
				Containers:     []*runpb.Container{{Name: "ops", Image: img, Command: []string{"/ops"}, Args: []string{"upgrade"}}},
				Retries:        &runpb.TaskTemplate_MaxRetries{MaxRetries: 0},
				Timeout:        durationpb.New(45 * time.Minute),
				ServiceAccount: testSA,
				VpcAccess: &runpb.VpcAccess{
					Egress:            runpb.VpcAccess_PRIVATE_RANGES_ONLY,
					NetworkInterfaces: []*runpb.VpcAccess_NetworkInterface{{Network: "ops-net", Subnetwork: "ops-subnet"}},
				},
			},
		},
	}
}

func diffProto(t *testing.T, what string, got, want proto.Message) {
	t.Helper()
	if !proto.Equal(got, want) {
		opts := prototext.MarshalOptions{Multiline: true}
		t.Fatalf("%s differs\nwant:\n%s\ngot:\n%s", what, opts.Format(want), opts.Format(got))
	}
}

// A release that verifies creates the job exactly as specified, grants the
// admin its two roles, runs the job once without overrides, and records the
// new version. The next release updates only what differs.
func TestCloudRunConvergeSucceeds(t *testing.T) {
	key := newKeyPair(t, signing.P256)
	reg := t.TempDir()
	writeRelease(t, reg, key, manifest("1.1.0", "1.0.0"))
	writeRelease(t, reg, key, manifest("1.2.0-rc.1", "1.1.0"))
	fake := cloudrunfake.Start(t)
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	_, r := startWorker(t, js, cloudRunConfig(reg, key, fake))

	id := publishRelease(t, js, "1.1.0", "")
	got := waitOutcomes(t, js, 1)

	creates := fake.CreateRequests()
	if len(creates) != 1 {
		t.Fatalf("%d CreateJob requests, want 1", len(creates))
	}
	diffProto(t, "CreateJob request", creates[0], &runpb.CreateJobRequest{
		Parent: "projects/steward-test/locations/europe-west1",
		JobId:  testJob,
		Job:    wantJob("1-1-0", "1.1.0", id, image("1.1.0")),
	})
	sets := fake.SetPolicyRequests()
	if len(sets) != 1 {
		t.Fatalf("%d SetIamPolicy requests, want 1", len(sets))
	}
	diffProto(t, "SetIamPolicy request", sets[0], &iampb.SetIamPolicyRequest{
		Resource: testJobName,
		Policy: &iampb.Policy{Version: 1, Etag: []byte("ACAB"), Bindings: []*iampb.Binding{
			{Role: "roles/run.jobsExecutor", Members: []string{testAdmin}},
			{Role: "roles/run.viewer", Members: []string{testAdmin}},
		}},
	})
	runs := fake.RunRequests()
	if len(runs) != 1 {
		t.Fatalf("%d RunJob requests, want 1", len(runs))
	}
	// No overrides, no validate-only, no etag: the job as ensured runs.
	diffProto(t, "RunJob request", runs[0], &runpb.RunJobRequest{Name: testJobName})
	execs := fake.Executions()
	if len(execs) != 1 {
		t.Fatalf("executions %v, want one", execs)
	}
	s := outcomeData[Succeeded](t, got[0], OutcomeSucceeded)
	if s != (Succeeded{Install: testInstall, From: "1.0.0", To: "1.1.0", Execution: execs[0]}) {
		t.Fatalf("succeeded %+v", s)
	}
	if v := recorded(t, r); v != "1.1.0" {
		t.Fatalf("installed version %q, want 1.1.0", v)
	}

	// The next release: the job's image and version label change, nothing
	// else; the admin already holds its roles, so IAM is left alone.
	id = publishRelease(t, js, "1.2.0-rc.1", "")
	got = waitOutcomes(t, js, 2)
	if s := outcomeData[Succeeded](t, got[1], OutcomeSucceeded); s.From != "1.1.0" || s.To != "1.2.0-rc.1" {
		t.Fatalf("second converge %+v", s)
	}
	updates := fake.UpdateRequests()
	if len(updates) != 1 {
		t.Fatalf("%d UpdateJob requests, want 1", len(updates))
	}
	job := updates[0].GetJob()
	diffProto(t, "updated job template", job.GetTemplate(), wantJob("1-2-0-rc-1", "1.2.0-rc.1", id, image("1.2.0-rc.1")).GetTemplate())
	if job.GetName() != testJobName || job.GetEtag() == "" {
		t.Fatalf("update names %q with etag %q", job.GetName(), job.GetEtag())
	}
	if n := len(fake.SetPolicyRequests()); n != 1 {
		t.Fatalf("%d SetIamPolicy requests after the second converge, want still 1", n)
	}
	if n := len(fake.RunRequests()); n != 2 {
		t.Fatalf("%d RunJob requests, want 2", n)
	}
	if v := recorded(t, r); v != "1.2.0-rc.1" {
		t.Fatalf("installed version %q", v)
	}
	if dl := workertest.DeadLetters(t, js, Name, testInstall); len(dl) != 0 {
		t.Fatalf("dead letters: %+v", dl)
	}
}

// A job an operator made by hand is brought to the release's spec: env,
// secrets, extra containers and retries go, server fields and other labels
// stay; the admin's roles are merged into the existing policy against its
// etag, leaving other members' bindings as they were.
func TestCloudRunUpdatesExistingJobAndMergesIAM(t *testing.T) {
	key := newKeyPair(t, signing.P256)
	reg := t.TempDir()
	writeRelease(t, reg, key, manifest("1.1.0", "1.0.0"))
	fake := cloudrunfake.Start(t)
	fake.PutJob(&runpb.Job{
		Name:   testJobName,
		Labels: map[string]string{"team": "shop", "steward-version": "0-9-0"},
		Uid:    "job-uid-1",
		// Left in place, an update would also start an execution.
		CreateExecution: &runpb.Job_RunExecutionToken{RunExecutionToken: "operator-token"},
		Template: &runpb.ExecutionTemplate{
			TaskCount: 3,
			Template: &runpb.TaskTemplate{
				Containers: []*runpb.Container{
					{
						Name: "ops", Image: "europe-docker.pkg.dev/steward-test/ops/shop-ops:latest",
						Env:          []*runpb.EnvVar{{Name: "DB_PASSWORD", Values: &runpb.EnvVar_ValueSource{ValueSource: &runpb.EnvVarSource{SecretKeyRef: &runpb.SecretKeySelector{Secret: "db", Version: "latest"}}}}},
						Resources:    &runpb.ResourceRequirements{Limits: map[string]string{"cpu": "1", "memory": "512Mi"}},
						VolumeMounts: []*runpb.VolumeMount{{Name: "creds", MountPath: "/creds"}},
					},
					{Name: "sidecar", Image: "busybox"},
				},
				Volumes:              []*runpb.Volume{{Name: "creds", VolumeType: &runpb.Volume_Secret{Secret: &runpb.SecretVolumeSource{Secret: "creds"}}}},
				Retries:              &runpb.TaskTemplate_MaxRetries{MaxRetries: 3},
				Timeout:              durationpb.New(10 * time.Minute),
				ServiceAccount:       "123-compute@developer.gserviceaccount.com",
				ExecutionEnvironment: runpb.ExecutionEnvironment_EXECUTION_ENVIRONMENT_GEN2,
			},
		},
	})
	fake.PutPolicy(testJobName, &iampb.Policy{Version: 1, Bindings: []*iampb.Binding{
		{Role: "roles/run.invoker", Members: []string{"user:alice@example.com"}},
		{Role: "roles/run.viewer", Members: []string{"user:bob@example.com"}},
	}})
	before := fake.Policy(testJobName)
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	startWorker(t, js, cloudRunConfig(reg, key, fake))

	id := publishRelease(t, js, "1.1.0", "")
	got := waitOutcomes(t, js, 1)
	outcomeData[Succeeded](t, got[0], OutcomeSucceeded)

	if n := len(fake.CreateRequests()); n != 0 {
		t.Fatalf("%d CreateJob requests for an existing job", n)
	}
	updates := fake.UpdateRequests()
	if len(updates) != 1 {
		t.Fatalf("%d UpdateJob requests, want 1", len(updates))
	}
	want := wantJob("1-1-0", "1.1.0", id, image("1.1.0"))
	want.Name, want.Uid, want.Etag = testJobName, "job-uid-1", updates[0].GetJob().GetEtag()
	want.Labels = map[string]string{"team": "shop", "steward-install": "shop", "steward-version": "1-1-0", "managed-by": "steward"}
	want.Template.Template.Containers[0].Resources = &runpb.ResourceRequirements{Limits: map[string]string{"cpu": "1", "memory": "512Mi"}}
	want.Template.Template.ExecutionEnvironment = runpb.ExecutionEnvironment_EXECUTION_ENVIRONMENT_GEN2
	diffProto(t, "UpdateJob request", updates[0], &runpb.UpdateJobRequest{Job: want})

	sets := fake.SetPolicyRequests()
	if len(sets) != 1 {
		t.Fatalf("%d SetIamPolicy requests, want 1", len(sets))
	}
	diffProto(t, "SetIamPolicy request", sets[0], &iampb.SetIamPolicyRequest{
		Resource: testJobName,
		Policy: &iampb.Policy{Version: 1, Etag: before.GetEtag(), Bindings: []*iampb.Binding{
			{Role: "roles/run.invoker", Members: []string{"user:alice@example.com"}},
			{Role: "roles/run.viewer", Members: []string{"user:bob@example.com", testAdmin}},
			{Role: "roles/run.jobsExecutor", Members: []string{testAdmin}},
		}},
	})
}

// A failed execution is reported with its condition, is settled (no dead
// letter, no retry), and leaves the installed version as it was.
func TestCloudRunExecutionFails(t *testing.T) {
	key := newKeyPair(t, signing.P256)
	reg := t.TempDir()
	writeRelease(t, reg, key, manifest("1.1.0", "1.0.0"))
	fake := cloudrunfake.Start(t)
	fake.SetFate(cloudrunfake.Fail)
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	_, r := startWorker(t, js, cloudRunConfig(reg, key, fake))

	id := publishRelease(t, js, "1.1.0", "")
	got := waitOutcomes(t, js, 1)
	execs := fake.Executions()
	f := outcomeData[Failed](t, got[0], OutcomeFailed)
	wantCond := "Completed=FAILED (NON_ZERO_EXIT_CODE): " + cloudrunfake.FailureMessage
	if f != (Failed{Install: testInstall, Version: "1.1.0", Execution: execs[0], Condition: wantCond}) {
		t.Fatalf("failed outcome %+v", f)
	}
	if cause, _ := got[0].Extensions()["causationid"].(string); cause != id {
		t.Fatalf("failed outcome caused by %q, want %s", cause, id)
	}
	noDeadLetters(t, js, r)
	if v := recorded(t, r); v != "" {
		t.Fatalf("a failed converge recorded installed version %q", v)
	}
	if n := len(fake.RunRequests()); n != 1 {
		t.Fatalf("%d RunJob requests, want 1 (a failure is not retried by itself)", n)
	}
}

// A worker killed while its execution runs: the next worker resumes from
// the checkpoint, watches the same execution, and Cloud Run sees one RunJob.
func TestCloudRunWorkerKilledWhileExecutionRuns(t *testing.T) {
	key := newKeyPair(t, signing.P256)
	reg := t.TempDir()
	writeRelease(t, reg, key, manifest("1.1.0", "1.0.0"))
	fake := cloudrunfake.Start(t)
	fake.SetFate(cloudrunfake.Running)
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	cfg := cloudRunConfig(reg, key, fake)
	opts := []workers.Option{workers.WithAckWait(time.Second), workers.WithShutdownGrace(50 * time.Millisecond)}

	// The first worker has its own NATS and Cloud Run connections.
	ncA := srv.Connect(t)
	jsA, err := jetstream.New(ncA)
	if err != nil {
		t.Fatal(err)
	}
	wA, rA := startWorker(t, jsA, cfg, opts...)
	publishRelease(t, js, "1.1.0", "")
	var execution string
	workertest.WaitUntil(t, "the first worker watches a running execution", func() bool {
		if e := fake.Executions(); len(e) == 1 {
			execution = e[0]
			return fake.Polls(execution) >= 2
		}
		return false
	})

	// Kill it: its connections drop mid-handler, so it can neither ack nor
	// nak; the event comes back after AckWait.
	ncA.Close()
	_ = wA.Close()
	_ = rA.Stop()
	polled := fake.Polls(execution)

	startWorker(t, js, cfg, opts...)
	workertest.WaitUntil(t, "the second worker watches the same execution", func() bool {
		return fake.Polls(execution) >= polled+2
	})
	if n := len(fake.RunRequests()); n != 1 {
		t.Fatalf("%d RunJob requests, want 1", n)
	}
	if err := fake.Finish(execution, cloudrunfake.Succeed); err != nil {
		t.Fatal(err)
	}
	got := waitOutcomes(t, js, 1)
	s := outcomeData[Succeeded](t, got[0], OutcomeSucceeded)
	if s != (Succeeded{Install: testInstall, From: "1.0.0", To: "1.1.0", Execution: execution}) {
		t.Fatalf("succeeded %+v", s)
	}
	if e := fake.Executions(); len(e) != 1 || len(fake.RunRequests()) != 1 {
		t.Fatalf("executions %v after the restart, want only %s", e, execution)
	}
}

// Cloud Run being unavailable is retried, and a retry never starts a second
// execution.
func TestCloudRunUnavailableIsRetried(t *testing.T) {
	key := newKeyPair(t, signing.P256)
	reg := t.TempDir()
	writeRelease(t, reg, key, manifest("1.1.0", "1.0.0"))
	fake := cloudrunfake.Start(t)
	fake.FailNext("GetJob", codes.Unavailable)
	fake.FailNext("RunJob", codes.Unavailable)
	fake.FailNext("GetExecution", codes.Unavailable, codes.Unavailable)
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	_, r := startWorker(t, js, cloudRunConfig(reg, key, fake))

	publishRelease(t, js, "1.1.0", "")
	got := waitOutcomes(t, js, 1)
	outcomeData[Succeeded](t, got[0], OutcomeSucceeded)
	if n := fake.Calls("RunJob"); n != 2 {
		t.Fatalf("RunJob called %d times, want 2 (one Unavailable, one accepted)", n)
	}
	if n := len(fake.Executions()); n != 1 {
		t.Fatalf("%d executions, want 1", n)
	}
	if fake.Calls("GetExecution") < 3 {
		t.Fatalf("GetExecution called %d times, want at least 3", fake.Calls("GetExecution"))
	}
	if v := recorded(t, r); v != "1.1.0" {
		t.Fatalf("installed version %q", v)
	}
}

// find is how a lost start, a removed stage or a discarded one is never
// doubled: an execution is found by the event it was started for, and only
// by that event.
func TestCloudRunFindsExecutionByEvent(t *testing.T) {
	key := newKeyPair(t, signing.P256)
	fake := cloudrunfake.Start(t)
	fake.SetFate(cloudrunfake.Running)
	cfg := cloudRunConfig(t.TempDir(), key, fake)
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx := context.Background()
	rel := release{Install: testInstall, EventID: "Release.1.1.0/A", Version: "1.1.0", From: "1.0.0", Image: image("1.1.0")}
	if _, found, err := w.run.find(ctx, rel); err != nil || found {
		t.Fatalf("before the job exists: found %v, %v", found, err)
	}
	if err := w.run.ensure(ctx, rel); err != nil {
		t.Fatal(err)
	}
	first, err := w.run.start(ctx, rel)
	if err != nil {
		t.Fatal(err)
	}
	e := fake.Execution(first)
	if got := e.GetLabels()[LabelEvent]; got != "release-1-1-0-a" {
		t.Fatalf("execution labelled %s=%q", LabelEvent, got)
	}
	if a := e.GetAnnotations(); a[AnnotationEvent] != rel.EventID || a[AnnotationVersion] != "1.1.0" {
		t.Fatalf("execution annotations %v", a)
	}
	x, found, err := w.run.find(ctx, rel)
	if err != nil || !found || x.Name != first || x.Image != rel.Image || x.EventID != rel.EventID || x.Version != "1.1.0" || x.Done {
		t.Fatalf("find gave %+v, %v, %v; want %s running", x, found, err, first)
	}

	// Another event (its label is the same once made label-safe, its id
	// is not) has no execution, even of the same release.
	other := rel
	other.EventID = "release-1-1-0-a"
	if x, found, err := w.run.find(ctx, other); err != nil || found {
		t.Fatalf("find for another event gave %+v, %v, %v", x, found, err)
	}
	if n := len(fake.RunRequests()); n != 1 {
		t.Fatalf("%d RunJob requests, want 1", n)
	}
}
