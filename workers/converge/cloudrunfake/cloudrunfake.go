// Package cloudrunfake is an in-process Cloud Run Admin API (v2) server for
// tests: the real cloud.google.com/go/run client talks gRPC to it on
// 127.0.0.1 with insecure credentials and no authentication. It keeps jobs,
// IAM policies, executions and long-running operations in memory, records
// every request that changes something so tests can assert exactly what a
// worker asked for, and lets a test decide each execution's fate.
//
// Cloud Run is a paid API, so this fake is the one place Steward's tests do
// not run the real thing; it follows the API's shapes (operations whose
// metadata is the execution, the "Completed" condition, IAM etags) closely
// enough that the client library cannot tell.
package cloudrunfake

import (
	"context"
	"encoding/base64"
	"fmt"
	"maps"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"

	"cloud.google.com/go/iam/apiv1/iampb"
	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"cloud.google.com/go/run/apiv2/runpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Fate is what becomes of an execution.
type Fate int

// The fates a test can give an execution.
const (
	// Succeed completes the execution successfully.
	Succeed Fate = iota + 1
	// Fail completes it with a task that exited non-zero.
	Fail
	// Running leaves it running until Finish is called.
	Running
)

// String names the fate as tests print it.
func (f Fate) String() string {
	switch f {
	case Succeed:
		return "succeed"
	case Fail:
		return "fail"
	case Running:
		return "running"
	}
	return "fate(" + strconv.Itoa(int(f)) + ")"
}

// FailureMessage is the message of the Completed condition of a failed
// execution.
const FailureMessage = "Task 0 failed with exit code 1 after 0 retries"

// Server is the fake. Its zero value is not usable; call New or Start.
type Server struct {
	grpc *grpc.Server
	lis  net.Listener

	mu          sync.Mutex
	fate        Fate
	jobs        map[string]*runpb.Job
	policies    map[string]*iampb.Policy
	executions  map[string]*runpb.Execution
	order       []string
	execOps     map[string]string // operation name -> execution name
	ops         map[string]*longrunningpb.Operation
	polls       map[string]int
	creates     []*runpb.CreateJobRequest
	updates     []*runpb.UpdateJobRequest
	runs        []*runpb.RunJobRequest
	setPolicies []*iampb.SetIamPolicyRequest
	failNext    map[string][]codes.Code
	calls       map[string]int
	serial      int
}

// New starts a fake on 127.0.0.1 at a free port. New executions succeed
// until SetFate says otherwise. Close stops it.
func New() (*Server, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("cloudrunfake: listen: %w", err)
	}
	s := &Server{
		lis:        lis,
		grpc:       grpc.NewServer(),
		fate:       Succeed,
		jobs:       map[string]*runpb.Job{},
		policies:   map[string]*iampb.Policy{},
		executions: map[string]*runpb.Execution{},
		execOps:    map[string]string{},
		ops:        map[string]*longrunningpb.Operation{},
		polls:      map[string]int{},
		failNext:   map[string][]codes.Code{},
		calls:      map[string]int{},
	}
	runpb.RegisterJobsServer(s.grpc, jobsServer{s: s})
	runpb.RegisterExecutionsServer(s.grpc, executionsServer{s: s})
	longrunningpb.RegisterOperationsServer(s.grpc, operationsServer{s: s})
	go func() { _ = s.grpc.Serve(lis) }()
	return s, nil
}

// Start is New for a test: it fails the test if the fake cannot start and
// stops it when the test ends.
func Start(tb testing.TB) *Server {
	tb.Helper()
	s, err := New()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s
}

// Endpoint is the host:port to give the client (option.WithEndpoint).
func (s *Server) Endpoint() string { return s.lis.Addr().String() }

// Close stops the server at once, dropping open connections.
func (s *Server) Close() { s.grpc.Stop() }

// SetFate sets the fate of the executions RunJob creates from now on.
func (s *Server) SetFate(f Fate) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fate = f
}

// Finish ends a running execution with fate Succeed or Fail.
func (s *Server) Finish(execution string, f Fate) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.executions[execution]
	if !ok {
		return fmt.Errorf("cloudrunfake: no execution %q", execution)
	}
	if f != Succeed && f != Fail {
		return fmt.Errorf("cloudrunfake: an execution finishes with %v or %v, not %v", Succeed, Fail, f)
	}
	s.settle(e, f)
	return nil
}

// FailNext makes the next calls of a method (e.g. "RunJob", "GetExecution")
// fail with the given codes, one per call, before it works again.
func (s *Server) FailNext(method string, codes ...codes.Code) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failNext[method] = append(s.failNext[method], codes...)
}

// PutJob stores a job as if it existed before the test, e.g. one an
// operator made by hand.
func (s *Server) PutJob(job *runpb.Job) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j := proto.Clone(job).(*runpb.Job)
	if j.Etag == "" {
		j.Etag = s.nextEtag()
	}
	s.jobs[j.Name] = j
}

// PutExecution stores an execution of a job as if it had run before the
// test (another event's, one that ran another image, one that failed),
// with fate Succeed, Fail or Running. Its name must be
// <job>/executions/<id> of a job the fake has (PutJob); its labels, annotations and template are kept as
// given, and its creation time, when unset, makes it the newest. The job's
// execution count and latest execution are not changed, as for an
// execution started outside the worker's view.
func (s *Server) PutExecution(e *runpb.Execution, f Fate) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f != Succeed && f != Fail && f != Running {
		return fmt.Errorf("cloudrunfake: an execution's fate is %v, %v or %v, not %v", Succeed, Fail, Running, f)
	}
	job, _, ok := strings.Cut(e.GetName(), "/executions/")
	if !ok || parentOf(job) == job {
		return fmt.Errorf("cloudrunfake: execution name %q is not <job>/executions/<id>", e.GetName())
	}
	if _, ok := s.jobs[job]; !ok {
		return fmt.Errorf("cloudrunfake: execution %q belongs to job %s, which does not exist; PutJob it first", e.GetName(), job)
	}
	if _, dup := s.executions[e.GetName()]; dup {
		return fmt.Errorf("cloudrunfake: execution %q exists", e.GetName())
	}
	x := proto.Clone(e).(*runpb.Execution)
	if x.CreateTime == nil {
		x.CreateTime = timestamppb.Now()
	}
	x.Job = job[strings.LastIndex(job, "/")+1:]
	x.TaskCount = max(x.TaskCount, 1)
	x.Conditions = []*runpb.Condition{{Type: "Completed", State: runpb.Condition_CONDITION_RECONCILING}}
	x.RunningCount = 1
	s.executions[x.Name] = x
	s.order = append(s.order, x.Name)
	if f != Running {
		s.settle(x, f)
	}
	return nil
}

// PutPolicy stores an IAM policy on a resource as if it existed before the
// test; its etag is replaced by a fresh one.
func (s *Server) PutPolicy(resource string, p *iampb.Policy) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := proto.Clone(p).(*iampb.Policy)
	c.Etag = []byte(s.nextEtag())
	s.policies[resource] = c
}

// Job returns a copy of the stored job, or nil.
func (s *Server) Job(name string) *runpb.Job {
	s.mu.Lock()
	defer s.mu.Unlock()
	if j, ok := s.jobs[name]; ok {
		return proto.Clone(j).(*runpb.Job)
	}
	return nil
}

// Policy returns a copy of the IAM policy stored on a resource, or nil.
func (s *Server) Policy(resource string) *iampb.Policy {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.policies[resource]; ok {
		return proto.Clone(p).(*iampb.Policy)
	}
	return nil
}

// Execution returns a copy of an execution, or nil.
func (s *Server) Execution(name string) *runpb.Execution {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.executions[name]; ok {
		return proto.Clone(e).(*runpb.Execution)
	}
	return nil
}

// Executions lists the names of every execution, oldest first.
func (s *Server) Executions() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.order...)
}

// Polls says how many times GetExecution was asked about an execution.
func (s *Server) Polls(execution string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.polls[execution]
}

// Calls says how many times a method was called, failed calls included.
func (s *Server) Calls(method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[method]
}

// CreateRequests returns copies of the CreateJob requests received.
func (s *Server) CreateRequests() []*runpb.CreateJobRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return cloneAll(s.creates)
}

// UpdateRequests returns copies of the UpdateJob requests received.
func (s *Server) UpdateRequests() []*runpb.UpdateJobRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return cloneAll(s.updates)
}

// RunRequests returns copies of the RunJob requests received.
func (s *Server) RunRequests() []*runpb.RunJobRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return cloneAll(s.runs)
}

// SetPolicyRequests returns copies of the SetIamPolicy requests received.
func (s *Server) SetPolicyRequests() []*iampb.SetIamPolicyRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return cloneAll(s.setPolicies)
}

func cloneAll[T proto.Message](in []T) []T {
	out := make([]T, len(in))
	for i, m := range in {
		out[i] = proto.Clone(m).(T)
	}
	return out
}

// enter counts a call and returns the injected failure, if any. Callers
// hold s.mu.
func (s *Server) enter(method string) error {
	s.calls[method]++
	if q := s.failNext[method]; len(q) > 0 {
		s.failNext[method] = q[1:]
		return status.Errorf(q[0], "cloudrunfake: injected %v for %s", q[0], method)
	}
	return nil
}

func (s *Server) nextEtag() string {
	s.serial++
	return base64.StdEncoding.EncodeToString([]byte("etag-" + strconv.Itoa(s.serial)))
}

// settle ends an execution and its RunJob operation. Callers hold s.mu.
func (s *Server) settle(e *runpb.Execution, f Fate) {
	now := timestamppb.Now()
	e.CompletionTime = now
	e.RunningCount = 0
	cond := &runpb.Condition{Type: "Completed", LastTransitionTime: now}
	if f == Succeed {
		e.SucceededCount = 1
		cond.State = runpb.Condition_CONDITION_SUCCEEDED
	} else {
		e.FailedCount = 1
		cond.State = runpb.Condition_CONDITION_FAILED
		cond.Message = FailureMessage
		cond.Reasons = &runpb.Condition_ExecutionReason_{ExecutionReason: runpb.Condition_NON_ZERO_EXIT_CODE}
	}
	e.Conditions = []*runpb.Condition{cond}
	for opName, execName := range s.execOps {
		if execName != e.Name {
			continue
		}
		op := s.ops[opName]
		meta, _ := anypb.New(e)
		op.Metadata = meta
		op.Done = true
		op.Result = &longrunningpb.Operation_Response{Response: meta}
	}
}

func doneOp(name string, resp proto.Message) (*longrunningpb.Operation, error) {
	a, err := anypb.New(resp)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "cloudrunfake: %v", err)
	}
	return &longrunningpb.Operation{Name: name, Done: true, Result: &longrunningpb.Operation_Response{Response: a}}, nil
}

// parent is "projects/<p>/locations/<r>" of a job or execution name.
func parentOf(name string) string {
	parts := strings.Split(name, "/")
	if len(parts) < 4 {
		return name
	}
	return strings.Join(parts[:4], "/")
}

type jobsServer struct {
	runpb.UnimplementedJobsServer
	s *Server
}

func (j jobsServer) GetJob(_ context.Context, req *runpb.GetJobRequest) (*runpb.Job, error) {
	s := j.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("GetJob"); err != nil {
		return nil, err
	}
	job, ok := s.jobs[req.GetName()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "Resource '%s' was not found", req.GetName())
	}
	return proto.Clone(job).(*runpb.Job), nil
}

func (j jobsServer) CreateJob(_ context.Context, req *runpb.CreateJobRequest) (*longrunningpb.Operation, error) {
	s := j.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("CreateJob"); err != nil {
		return nil, err
	}
	s.creates = append(s.creates, proto.Clone(req).(*runpb.CreateJobRequest))
	if req.GetParent() == "" || req.GetJobId() == "" || req.GetJob() == nil {
		return nil, status.Error(codes.InvalidArgument, "parent, job_id and job are required")
	}
	if req.GetJob().GetName() != "" {
		return nil, status.Error(codes.InvalidArgument, "job.name must be empty on create; it is parent/jobs/job_id")
	}
	name := req.GetParent() + "/jobs/" + req.GetJobId()
	if _, ok := s.jobs[name]; ok {
		return nil, status.Errorf(codes.AlreadyExists, "Resource '%s' already exists", name)
	}
	job := proto.Clone(req.GetJob()).(*runpb.Job)
	job.Name = name
	job.Generation = 1
	job.Etag = s.nextEtag()
	s.jobs[name] = job
	return doneOp(parentOf(name)+"/operations/create-"+strconv.Itoa(s.serial), job)
}

func (j jobsServer) UpdateJob(_ context.Context, req *runpb.UpdateJobRequest) (*longrunningpb.Operation, error) {
	s := j.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("UpdateJob"); err != nil {
		return nil, err
	}
	s.updates = append(s.updates, proto.Clone(req).(*runpb.UpdateJobRequest))
	name := req.GetJob().GetName()
	old, ok := s.jobs[name]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "Resource '%s' was not found", name)
	}
	if e := req.GetJob().GetEtag(); e != "" && e != old.Etag {
		return nil, status.Errorf(codes.Aborted, "etag %q does not match the job's current %q", e, old.Etag)
	}
	job := proto.Clone(req.GetJob()).(*runpb.Job)
	job.Generation = old.Generation + 1
	job.Etag = s.nextEtag()
	job.ExecutionCount = old.ExecutionCount
	job.LatestCreatedExecution = old.LatestCreatedExecution
	s.jobs[name] = job
	return doneOp(parentOf(name)+"/operations/update-"+strconv.Itoa(s.serial), job)
}

func (j jobsServer) RunJob(_ context.Context, req *runpb.RunJobRequest) (*longrunningpb.Operation, error) {
	s := j.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("RunJob"); err != nil {
		return nil, err
	}
	s.runs = append(s.runs, proto.Clone(req).(*runpb.RunJobRequest))
	job, ok := s.jobs[req.GetName()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "Resource '%s' was not found", req.GetName())
	}
	s.serial++
	jobID := job.Name[strings.LastIndex(job.Name, "/")+1:]
	execName := fmt.Sprintf("%s/executions/%s-%05d", job.Name, jobID, s.serial)
	tmpl := job.GetTemplate()
	e := &runpb.Execution{
		Name:         execName,
		Uid:          "uid-" + strconv.Itoa(s.serial),
		Generation:   1,
		Labels:       maps.Clone(tmpl.GetLabels()),
		Annotations:  maps.Clone(tmpl.GetAnnotations()),
		Job:          jobID,
		CreateTime:   timestamppb.Now(),
		StartTime:    timestamppb.Now(),
		TaskCount:    max(tmpl.GetTaskCount(), 1),
		Parallelism:  tmpl.GetParallelism(),
		Template:     proto.Clone(tmpl.GetTemplate()).(*runpb.TaskTemplate),
		RunningCount: 1,
		Conditions:   []*runpb.Condition{{Type: "Completed", State: runpb.Condition_CONDITION_RECONCILING}},
	}
	if req.GetOverrides() != nil {
		// Kept as received so a test can see an override was asked for.
		if e.Annotations == nil {
			e.Annotations = map[string]string{}
		}
		e.Annotations["cloudrunfake/overridden"] = "true"
	}
	s.executions[execName] = e
	s.order = append(s.order, execName)
	job.ExecutionCount++
	job.LatestCreatedExecution = &runpb.ExecutionReference{Name: execName, CreateTime: e.CreateTime}
	opName := parentOf(job.Name) + "/operations/run-" + strconv.Itoa(s.serial)
	meta, err := anypb.New(e)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "cloudrunfake: %v", err)
	}
	s.ops[opName] = &longrunningpb.Operation{Name: opName, Metadata: meta}
	s.execOps[opName] = execName
	if s.fate != Running {
		s.settle(e, s.fate)
	}
	return proto.Clone(s.ops[opName]).(*longrunningpb.Operation), nil
}

func (j jobsServer) GetIamPolicy(_ context.Context, req *iampb.GetIamPolicyRequest) (*iampb.Policy, error) {
	s := j.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("GetIamPolicy"); err != nil {
		return nil, err
	}
	if _, ok := s.jobs[req.GetResource()]; !ok {
		return nil, status.Errorf(codes.NotFound, "Resource '%s' was not found", req.GetResource())
	}
	p, ok := s.policies[req.GetResource()]
	if !ok {
		// An empty policy still has an etag, as the real API's does.
		p = &iampb.Policy{Version: 1, Etag: []byte("ACAB")}
		s.policies[req.GetResource()] = p
	}
	return proto.Clone(p).(*iampb.Policy), nil
}

func (j jobsServer) SetIamPolicy(_ context.Context, req *iampb.SetIamPolicyRequest) (*iampb.Policy, error) {
	s := j.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("SetIamPolicy"); err != nil {
		return nil, err
	}
	s.setPolicies = append(s.setPolicies, proto.Clone(req).(*iampb.SetIamPolicyRequest))
	if _, ok := s.jobs[req.GetResource()]; !ok {
		return nil, status.Errorf(codes.NotFound, "Resource '%s' was not found", req.GetResource())
	}
	cur := s.policies[req.GetResource()]
	if e := req.GetPolicy().GetEtag(); len(e) > 0 && cur != nil && string(e) != string(cur.Etag) {
		return nil, status.Error(codes.Aborted, "There were concurrent policy changes. Please retry the whole read-modify-write with exponential backoff.")
	}
	p := proto.Clone(req.GetPolicy()).(*iampb.Policy)
	p.Etag = []byte(s.nextEtag())
	s.policies[req.GetResource()] = p
	return proto.Clone(p).(*iampb.Policy), nil
}

type executionsServer struct {
	runpb.UnimplementedExecutionsServer
	s *Server
}

func (x executionsServer) GetExecution(_ context.Context, req *runpb.GetExecutionRequest) (*runpb.Execution, error) {
	s := x.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("GetExecution"); err != nil {
		return nil, err
	}
	s.polls[req.GetName()]++
	e, ok := s.executions[req.GetName()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "Resource '%s' was not found", req.GetName())
	}
	return proto.Clone(e).(*runpb.Execution), nil
}

// ListExecutions lists a job's executions, newest first as the API does,
// in pages of page_size (default 100). A job that does not exist is
// NotFound.
func (x executionsServer) ListExecutions(_ context.Context, req *runpb.ListExecutionsRequest) (*runpb.ListExecutionsResponse, error) {
	s := x.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("ListExecutions"); err != nil {
		return nil, err
	}
	parent := req.GetParent()
	if _, ok := s.jobs[parent]; !ok {
		return nil, status.Errorf(codes.NotFound, "Resource '%s' was not found", parent)
	}
	var all []*runpb.Execution
	for i := len(s.order) - 1; i >= 0; i-- {
		if name := s.order[i]; strings.HasPrefix(name, parent+"/executions/") {
			all = append(all, s.executions[name])
		}
	}
	start := 0
	if tok := req.GetPageToken(); tok != "" {
		n, err := strconv.Atoi(tok)
		if err != nil || n < 0 || n > len(all) {
			return nil, status.Errorf(codes.InvalidArgument, "page token %q is not one this server gave", tok)
		}
		start = n
	}
	size := int(req.GetPageSize())
	if size <= 0 {
		size = 100
	}
	end := min(start+size, len(all))
	resp := &runpb.ListExecutionsResponse{}
	for _, e := range all[start:end] {
		resp.Executions = append(resp.Executions, proto.Clone(e).(*runpb.Execution))
	}
	if end < len(all) {
		resp.NextPageToken = strconv.Itoa(end)
	}
	return resp, nil
}

type operationsServer struct {
	longrunningpb.UnimplementedOperationsServer
	s *Server
}

func (o operationsServer) GetOperation(_ context.Context, req *longrunningpb.GetOperationRequest) (*longrunningpb.Operation, error) {
	s := o.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("GetOperation"); err != nil {
		return nil, err
	}
	op, ok := s.ops[req.GetName()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "operation %q was not found", req.GetName())
	}
	return proto.Clone(op).(*longrunningpb.Operation), nil
}

// WaitOperation answers at once with the operation as it stands, which the
// API allows ("the server may return before the timeout").
func (o operationsServer) WaitOperation(ctx context.Context, req *longrunningpb.WaitOperationRequest) (*longrunningpb.Operation, error) {
	return o.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: req.GetName()})
}
