package converge

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"cloud.google.com/go/iam/apiv1/iampb"
	run "cloud.google.com/go/run/apiv2"
	"cloud.google.com/go/run/apiv2/runpb"
	gax "github.com/googleapis/gax-go/v2"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The ops job's fixed entry point. The release is the image itself, so the
// job needs no environment and no overrides: what runs is decided by the
// signed manifest alone.
const (
	OpsCommand = "/ops"
	OpsArg     = "upgrade"
	// OpsContainer is the name of the job's only container.
	OpsContainer = "ops"
)

// Labels Steward puts on the job and its executions.
const (
	LabelInstall   = "steward-install"
	LabelVersion   = "steward-version"
	LabelManagedBy = "managed-by"
	// LabelEvent is on executions only: the label-safe form of the
	// release.published event the execution was started for, so an
	// operator can filter by it (gcloud run jobs executions list
	// --filter=labels.steward-event=...).
	LabelEvent = "steward-event"
)

// Annotations Steward puts on its executions (through the job's execution
// template). Labels are lossy (lowercase, 63 characters, '.' and '+'
// become '-'), so the exact event id and version an execution ran for are
// read from these; the label only has to agree.
const (
	AnnotationEvent   = "steward.dev/event-id"
	AnnotationVersion = "steward.dev/version"
)

// The roles the admin member holds on the job: run it and watch it, nothing
// that changes what it runs.
const (
	RoleJobsExecutor = "roles/run.jobsExecutor"
	RoleViewer       = "roles/run.viewer"
)

// result is how an execution ended.
type result struct {
	Succeeded bool   `json:"succeeded"`
	Condition string `json:"condition,omitempty"`
}

// execution is what a runner says of one execution of this install's ops
// job: the outside world's account, which a stage's claims are checked
// against and the installed version is rebuilt from.
type execution struct {
	Name string
	// Image is the one image the execution ran ("" when it ran anything
	// but exactly one container).
	Image string
	// EventID and Version are the release.published event and the
	// version it was started for, as Steward labelled it.
	EventID string
	Version string
	// EventLabel is its steward-event label; it stands for EventID only
	// where the annotation is missing (see forEvent).
	EventLabel string
	Created    time.Time
	// Done is set once it ended; Result is then how.
	Done   bool
	Result result
}

// runner runs a release's ops job.
type runner interface {
	// ensure makes the job ready to run rel, idempotently.
	ensure(ctx context.Context, rel release) error
	// start starts one execution for rel's event and returns its name.
	// The handler calls it only after find found none.
	start(ctx context.Context, rel release) (execution string, err error)
	// find returns the newest execution of this install's job started
	// for rel's event, if the runner has one: a start whose answer or
	// checkpoint was lost, or whose stage was removed, left it.
	find(ctx context.Context, rel release) (execution, bool, error)
	// lookup returns the execution named name if the runner has it and
	// it is one of this install's job's, Steward-labelled.
	lookup(ctx context.Context, rel release, name string) (execution, bool, error)
	// watch waits until the execution ends.
	watch(ctx context.Context, rel release, execution string) (result, error)
	// history returns every Steward execution of this install's job the
	// runner knows, newest first. kept is false when the runner keeps no
	// record of past executions at all (the exec runner without
	// --exec-record-dir), so their absence means nothing.
	history(ctx context.Context) (execs []execution, kept bool, err error)
	close() error
}

// cloudRun runs the ops job on Cloud Run.
type cloudRun struct {
	cfg   *checked
	jobs  *run.JobsClient
	execs *run.ExecutionsClient
}

func newCloudRun(ctx context.Context, cfg *checked) (*cloudRun, error) {
	var opts []option.ClientOption
	if cfg.CloudRunEndpoint != "" {
		opts = append(opts,
			option.WithEndpoint(cfg.CloudRunEndpoint),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
			option.WithoutAuthentication(),
		)
	}
	jobs, err := run.NewJobsClient(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("cloud run jobs client: %w", err)
	}
	execs, err := run.NewExecutionsClient(ctx, opts...)
	if err != nil {
		jobs.Close()
		return nil, fmt.Errorf("cloud run executions client: %w", err)
	}
	return &cloudRun{cfg: cfg, jobs: jobs, execs: execs}, nil
}

func (c *cloudRun) close() error {
	return errors.Join(c.jobs.Close(), c.execs.Close())
}

func (c *cloudRun) parent() string {
	return "projects/" + c.cfg.CloudRunProject + "/locations/" + c.cfg.CloudRunRegion
}

func (c *cloudRun) jobName() string { return c.parent() + "/jobs/" + c.cfg.CloudRunJob }

// labelValue turns a value into a GCP label value: lowercase letters,
// digits, '_' and '-', at most 63 characters ("1.2.0-rc.1" -> "1-2-0-rc-1").
func labelValue(s string) string {
	b := []byte(strings.ToLower(s))
	for i, ch := range b {
		if (ch < 'a' || ch > 'z') && (ch < '0' || ch > '9') && ch != '_' && ch != '-' {
			b[i] = '-'
		}
	}
	return string(b[:min(len(b), 63)])
}

// executionLabels are the job's labels plus the event's, for the execution
// template: every execution started from it carries them.
func (c *cloudRun) executionLabels(rel release) map[string]string {
	l := c.labels(rel)
	l[LabelEvent] = labelValue(rel.EventID)
	return l
}

func (c *cloudRun) labels(rel release) map[string]string {
	return map[string]string{
		LabelInstall:   labelValue(rel.Install),
		LabelVersion:   labelValue(rel.Version),
		LabelManagedBy: "steward",
	}
}

// vpcAccess is the Direct VPC egress the configuration asks for, or nil.
func (c *cloudRun) vpcAccess() *runpb.VpcAccess {
	if c.cfg.CloudRunNetwork == "" && c.cfg.CloudRunSubnet == "" {
		return nil
	}
	return &runpb.VpcAccess{
		Egress:            runpb.VpcAccess_PRIVATE_RANGES_ONLY,
		NetworkInterfaces: []*runpb.VpcAccess_NetworkInterface{{Network: c.cfg.CloudRunNetwork, Subnetwork: c.cfg.CloudRunSubnet}},
	}
}

// desiredJob is the job Steward ensures for a release: exactly the
// manifest's image with the fixed command, no environment, no secrets, no
// retries, the task timeout, Steward's labels, the service account and the
// VPC settings.
func (c *cloudRun) desiredJob(rel release) *runpb.Job {
	return &runpb.Job{
		Labels: c.labels(rel),
		Template: &runpb.ExecutionTemplate{
			Labels:      c.executionLabels(rel),
			Annotations: map[string]string{AnnotationEvent: rel.EventID, AnnotationVersion: rel.Version},
			TaskCount:   1,
			Parallelism: 1,
			Template: &runpb.TaskTemplate{
				Containers: []*runpb.Container{{
					Name:    OpsContainer,
					Image:   rel.Image,
					Command: []string{OpsCommand},
					Args:    []string{OpsArg},
				}},
				Retries:        &runpb.TaskTemplate_MaxRetries{MaxRetries: 0},
				Timeout:        durationpb.New(c.cfg.TaskTimeout),
				ServiceAccount: c.cfg.CloudRunServiceAccount,
				VpcAccess:      c.vpcAccess(),
			},
		},
	}
}

// merge returns existing with every field Steward owns set as want has it,
// and whether anything changed. Fields Steward does not own (resources the
// server filled in, other labels, annotations) are kept, so an unchanged
// job is never rewritten; fields that would let the job run something else
// (more containers, env, secret volumes and mounts) are removed.
func merge(existing, want *runpb.Job) (*runpb.Job, bool) {
	job := proto.Clone(existing).(*runpb.Job)
	// An update that also starts an execution would run the job outside
	// the checkpointed start.
	job.CreateExecution = nil
	if job.Labels == nil {
		job.Labels = map[string]string{}
	}
	maps.Copy(job.Labels, want.Labels)
	if job.Template == nil {
		job.Template = &runpb.ExecutionTemplate{}
	}
	et, wt := job.Template, want.Template
	if et.Labels == nil {
		et.Labels = map[string]string{}
	}
	maps.Copy(et.Labels, wt.Labels)
	if et.Annotations == nil {
		et.Annotations = map[string]string{}
	}
	maps.Copy(et.Annotations, wt.Annotations)
	et.TaskCount, et.Parallelism = wt.TaskCount, wt.Parallelism
	if et.Template == nil {
		et.Template = &runpb.TaskTemplate{}
	}
	tt, wtt := et.Template, wt.Template
	want0 := wtt.Containers[0]
	var ctr *runpb.Container
	if len(tt.Containers) > 0 {
		ctr = tt.Containers[0]
	} else {
		ctr = &runpb.Container{}
	}
	ctr.Name, ctr.Image = want0.Name, want0.Image
	ctr.Command, ctr.Args = slices.Clone(want0.Command), slices.Clone(want0.Args)
	ctr.Env, ctr.VolumeMounts, ctr.DependsOn = nil, nil, nil
	// Source deploys and automatic base image updates would run something
	// other than the pinned image.
	ctr.SourceCode, ctr.BaseImageUri = nil, ""
	tt.Containers = []*runpb.Container{ctr}
	tt.Volumes = nil
	tt.Retries = &runpb.TaskTemplate_MaxRetries{MaxRetries: 0}
	tt.Timeout = proto.Clone(wtt.Timeout).(*durationpb.Duration)
	tt.ServiceAccount = wtt.ServiceAccount
	if wtt.VpcAccess == nil {
		tt.VpcAccess = nil
	} else {
		tt.VpcAccess = proto.Clone(wtt.VpcAccess).(*runpb.VpcAccess)
	}
	return job, !proto.Equal(job, existing)
}

func (c *cloudRun) ensure(ctx context.Context, rel release) error {
	want := c.desiredJob(rel)
	existing, err := c.jobs.GetJob(ctx, &runpb.GetJobRequest{Name: c.jobName()})
	switch {
	case status.Code(err) == codes.NotFound:
		op, err := c.jobs.CreateJob(ctx, &runpb.CreateJobRequest{Parent: c.parent(), JobId: c.cfg.CloudRunJob, Job: want})
		if err != nil {
			return cloudRunError("create job "+c.jobName(), err)
		}
		if _, err = waitJob(ctx, c.cfg.pollInterval, op.Poll); err != nil {
			return cloudRunError("create job "+c.jobName(), err)
		}
		rel.log().Info().Str("job", c.jobName()).Msg("cloud run job created")
	case err != nil:
		return cloudRunError("read job "+c.jobName(), err)
	default:
		if next, changed := merge(existing, want); changed {
			next.Etag = existing.Etag
			op, err := c.jobs.UpdateJob(ctx, &runpb.UpdateJobRequest{Job: next})
			if err != nil {
				return cloudRunError("update job "+c.jobName(), err)
			}
			if _, err = waitJob(ctx, c.cfg.pollInterval, op.Poll); err != nil {
				return cloudRunError("update job "+c.jobName(), err)
			}
			rel.log().Info().Str("job", c.jobName()).Msg("cloud run job updated")
		}
	}
	return c.ensureIAM(ctx)
}

// waitJob polls a job operation until it is done.
func waitJob(ctx context.Context, every time.Duration, poll func(context.Context, ...gax.CallOption) (*runpb.Job, error)) (*runpb.Job, error) {
	for {
		job, err := poll(ctx)
		if err != nil || job != nil {
			return job, err
		}
		if err := sleep(ctx, every); err != nil {
			return nil, err
		}
	}
}

// ensureIAM grants the admin member the two roles on the job, merged into
// the policy's existing bindings, written against the etag read so a
// concurrent change is never overwritten.
func (c *cloudRun) ensureIAM(ctx context.Context) error {
	resource := c.jobName()
	policy, err := c.jobs.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{
		Resource: resource,
		Options:  &iampb.GetPolicyOptions{RequestedPolicyVersion: 3},
	})
	if err != nil {
		return cloudRunError("read IAM policy of "+resource, err)
	}
	changed := false
	for _, role := range []string{RoleJobsExecutor, RoleViewer} {
		if grant(policy, role, c.cfg.CloudRunAdminMember) {
			changed = true
		}
	}
	if !changed {
		return nil
	}
	if _, err := c.jobs.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: resource, Policy: policy}); err != nil {
		return cloudRunError("set IAM policy of "+resource, err)
	}
	return nil
}

// grant adds member to the unconditional binding of role, creating it if
// needed, and reports whether the policy changed.
func grant(p *iampb.Policy, role, member string) bool {
	for _, b := range p.Bindings {
		if b.Role != role || b.Condition != nil {
			continue
		}
		if slices.Contains(b.Members, member) {
			return false
		}
		b.Members = append(b.Members, member)
		return true
	}
	p.Bindings = append(p.Bindings, &iampb.Binding{Role: role, Members: []string{member}})
	return true
}

func (c *cloudRun) start(ctx context.Context, rel release) (string, error) {
	// No overrides: the job as ensured is exactly what runs.
	op, err := c.jobs.RunJob(ctx, &runpb.RunJobRequest{Name: c.jobName()})
	if err != nil {
		return "", cloudRunError("run job "+c.jobName(), err)
	}
	meta, err := op.Metadata()
	if err == nil && meta.GetName() == "" {
		if _, err = op.Poll(ctx); err == nil {
			meta, err = op.Metadata()
		}
	}
	if err != nil || meta.GetName() == "" {
		// The execution exists but its name is unknown here; the retry
		// finds it by its event's label and watches it (find).
		return "", fmt.Errorf("run job %s for event %s started operation %s without naming its execution (%v); retrying finds it by its %s label and watches it", c.jobName(), rel.EventID, op.Name(), err, LabelEvent)
	}
	return meta.GetName(), nil
}

func (c *cloudRun) watch(ctx context.Context, rel release, execution string) (result, error) {
	for {
		e, err := c.execs.GetExecution(ctx, &runpb.GetExecutionRequest{Name: execution})
		if status.Code(err) == codes.NotFound {
			return result{Condition: "execution " + execution + " no longer exists, so whether it applied the release is unknown"}, nil
		}
		if err != nil {
			return result{}, cloudRunError("watch execution "+execution, err)
		}
		if r, done := executionResult(e); done {
			return r, nil
		}
		if err := sleep(ctx, c.cfg.pollInterval); err != nil {
			return result{}, err
		}
	}
}

// execution reads what Cloud Run says of e, and whether it is a Steward
// execution of this install's job at all: its name under the job, and
// Steward's labels for this install. Anything else (another project's or
// job's execution a forged stage names, an operator's own run) is not.
func (c *cloudRun) execution(e *runpb.Execution) (execution, bool) {
	l := e.GetLabels()
	if !strings.HasPrefix(e.GetName(), c.jobName()+"/executions/") ||
		l[LabelManagedBy] != "steward" || l[LabelInstall] != labelValue(c.cfg.Install) {
		return execution{}, false
	}
	a := e.GetAnnotations()
	x := execution{Name: e.GetName(), EventID: a[AnnotationEvent], Version: a[AnnotationVersion], EventLabel: l[LabelEvent], Created: e.GetCreateTime().AsTime()}
	// A label that disagrees with its annotation was not written by
	// Steward's template, so neither is believed.
	if x.EventID != "" && l[LabelEvent] != labelValue(x.EventID) {
		x.EventID, x.EventLabel = "", ""
	}
	if l[LabelVersion] != labelValue(x.Version) {
		x.Version = ""
	}
	if ctrs := e.GetTemplate().GetContainers(); len(ctrs) == 1 {
		x.Image = ctrs[0].GetImage()
	}
	x.Result, x.Done = executionResult(e)
	return x, true
}

// forEvent says whether x was started for the event id: by its exact
// annotation, or, on an execution that carries no annotation at all (should
// Cloud Run not copy the template's annotations onto it), by its label.
func (x execution) forEvent(id string) bool {
	if x.EventID != "" {
		return x.EventID == id
	}
	return x.EventLabel != "" && x.EventLabel == labelValue(id)
}

// list returns the Steward executions of this install's job, newest
// first. A job that does not exist has none.
func (c *cloudRun) list(ctx context.Context) ([]execution, error) {
	var out []execution
	it := c.execs.ListExecutions(ctx, &runpb.ListExecutionsRequest{Parent: c.jobName()})
	for {
		e, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if status.Code(err) == codes.NotFound {
			return nil, nil
		}
		if err != nil {
			return nil, cloudRunError("list executions of "+c.jobName(), err)
		}
		if x, ok := c.execution(e); ok {
			out = append(out, x)
		}
	}
	slices.SortStableFunc(out, func(a, b execution) int { return b.Created.Compare(a.Created) })
	return out, nil
}

func (c *cloudRun) find(ctx context.Context, rel release) (execution, bool, error) {
	all, err := c.list(ctx)
	if err != nil {
		return execution{}, false, err
	}
	for _, x := range all {
		if x.forEvent(rel.EventID) {
			return x, true, nil
		}
	}
	return execution{}, false, nil
}

func (c *cloudRun) lookup(ctx context.Context, _ release, name string) (execution, bool, error) {
	if !strings.HasPrefix(name, c.jobName()+"/executions/") {
		// Never asked: a name outside this install's job is no
		// execution of it, whatever Cloud Run would answer.
		return execution{}, false, nil
	}
	e, err := c.execs.GetExecution(ctx, &runpb.GetExecutionRequest{Name: name})
	if status.Code(err) == codes.NotFound {
		return execution{}, false, nil
	}
	if err != nil {
		return execution{}, false, cloudRunError("read execution "+name, err)
	}
	x, ok := c.execution(e)
	return x, ok, nil
}

func (c *cloudRun) history(ctx context.Context) ([]execution, bool, error) {
	all, err := c.list(ctx)
	return all, true, err
}

// executionResult reads an execution's terminal "Completed" condition. An
// execution is done once that condition has succeeded or failed, or once
// it has a completion time.
func executionResult(e *runpb.Execution) (result, bool) {
	for _, cond := range e.GetConditions() {
		if cond.GetType() != "Completed" {
			continue
		}
		switch cond.GetState() {
		case runpb.Condition_CONDITION_SUCCEEDED:
			return result{Succeeded: true}, true
		case runpb.Condition_CONDITION_FAILED:
			return result{Condition: describeCondition(cond)}, true
		}
	}
	if e.GetCompletionTime() == nil {
		return result{}, false
	}
	if e.GetFailedCount() == 0 && e.GetCancelledCount() == 0 && e.GetSucceededCount() >= max(e.GetTaskCount(), 1) {
		return result{Succeeded: true}, true
	}
	return result{Condition: fmt.Sprintf("completed with %d task(s) failed, %d cancelled, %d succeeded", e.GetFailedCount(), e.GetCancelledCount(), e.GetSucceededCount())}, true
}

func describeCondition(c *runpb.Condition) string {
	s := c.GetType() + "=" + strings.TrimPrefix(c.GetState().String(), "CONDITION_")
	if r := c.GetExecutionReason(); r != runpb.Condition_EXECUTION_REASON_UNDEFINED {
		s += " (" + r.String() + ")"
	}
	if m := c.GetMessage(); m != "" {
		s += ": " + m
	}
	return s
}

// cloudRunError classifies a Cloud Run error: an invalid request no retry
// fixes is permanent; everything else (Unavailable, quota, permissions an
// operator is fixing) is retried with backoff.
func cloudRunError(what string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", what, err)
	}
	switch status.Code(err) {
	case codes.InvalidArgument, codes.OutOfRange, codes.Unimplemented:
		return &runnerRefusal{err: fmt.Errorf("%s: Cloud Run refused the request: %w", what, err)}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// runnerRefusal is a runner failure no retry fixes, before any execution.
type runnerRefusal struct{ err error }

func (r *runnerRefusal) Error() string { return r.err.Error() }
func (r *runnerRefusal) Unwrap() error { return r.err }

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
