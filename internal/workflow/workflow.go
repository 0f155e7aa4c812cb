// Package workflow runs kip's long operations as ordered, named, resumable steps.
//
// A step decides whether it is done by looking at the real state (Check), never only at its
// record. The runner owns everything around the steps: the cluster lock, printing, dry runs, the
// progress record that says where to resume and what was intended, and stopping between steps
// on Ctrl-C. docs/records.md documents the progress record.
//
// # Fault injection
//
// For tests, a binary built with -tags kipfault kills itself with SIGKILL at the step boundary
// that FaultEnv (KIP_FAULT_KILL) names, as <point>:<step> where <step> is a step's Name or
// Title:
//
//   - before:<step>: the step's intent is recorded (its "applying" record written), its Apply
//     has not started;
//   - after:<step>: its Apply returned without error; the check after it and the progress
//     record have not run;
//   - done:<step>: the runner is through with the step and its record is written; the next
//     step's check comes next, or, after the last step, the finished record is written and the
//     lock is still held.
//
// PauseEnv (KIP_FAULT_PAUSE) names a point the same way at which the binary pauses instead: it
// creates the file PauseFileEnv (KIP_FAULT_PAUSE_FILE) names and goes on once that file is
// removed, so that a test can change the world at exactly that point of a run.
//
// Host workflows (no progress record) have the same points. Without the tag, or without the
// variables, the points do nothing; kip as shipped is built without the tag.
package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"kipper.run/kip/internal/fault"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/stop"
)

// FaultEnv is the environment variable naming the fault point at which a binary built with
// -tags kipfault kills itself (see the package documentation).
const FaultEnv = "KIP_FAULT_KILL"

// PauseEnv names the fault point at which a binary built with -tags kipfault pauses, and
// PauseFileEnv the file it creates there and waits to see removed (see the package
// documentation).
const (
	PauseEnv     = "KIP_FAULT_PAUSE"
	PauseFileEnv = "KIP_FAULT_PAUSE_FILE"
)

// Step is one named piece of a workflow.
type Step struct {
	// Name is the step's stable ID, stored in the progress record, e.g. "install-k3s".
	Name string
	// Title says what the step does, imperative: "Install k3s v1.37.2".
	Title string
	// Done says what it did: "Installed k3s v1.37.2".
	Done string
	// Already says that nothing needed doing: "k3s v1.37.2 already installed".
	Already string
	// Check reports whether the step's change is in place, by looking at the real state.
	Check func(ctx context.Context) (done bool, err error)
	// Plan, optional, lists what Apply would change, for a dry run.
	Plan func(ctx context.Context) ([]string, error)
	// Apply makes the change. It runs only when Check reports the step not done, and Check must
	// report it done afterwards.
	Apply func(ctx context.Context) error
}

// Workflow is an ordered list of steps and where its progress is recorded.
type Workflow struct {
	// Name identifies the operation and its progress record, kipper.run/op-<Name>. It is the same
	// whenever the same command is run again for the same target, e.g. "node-add-w1".
	Name string
	// Records is the object holding the progress record; the zero value means
	// kube.ClusterRecords().
	Records kube.ObjectRef
	// Intent, when not nil, points to the workflow's intent data (a struct the steps share): what
	// it decided to do, such as sizes and names. The runner records it before every Apply and
	// after every step, and a run that resumes an unfinished one first loads the recorded intent
	// into it, so a value a step decided survives until the steps that act on it finish.
	Intent any
	Steps  []Step
}

func (wf *Workflow) records() kube.ObjectRef {
	if wf.Records == (kube.ObjectRef{}) {
		return kube.ClusterRecords()
	}
	return wf.Records
}

func (wf *Workflow) validate() error {
	seen := map[string]bool{}
	for _, s := range wf.Steps {
		switch {
		case s.Name == "":
			return fmt.Errorf("workflow %s: a step has no name", wf.Name)
		case seen[s.Name]:
			return fmt.Errorf("workflow %s: two steps are named %s", wf.Name, s.Name)
		case s.Check == nil || s.Apply == nil:
			return fmt.Errorf("workflow %s: step %s needs both Check and Apply", wf.Name, s.Name)
		}
		seen[s.Name] = true
	}
	return nil
}

func (wf *Workflow) title(step string) string {
	for _, s := range wf.Steps {
		if s.Name == step {
			return s.Title
		}
	}
	return step
}

// Reporter shows a run's progress; cli.Printer implements it.
type Reporter interface {
	StepStarted(title string)
	StepDone(msg string, d time.Duration)
	StepAlready(msg string)
	StepFailed(title string, err error)
	Planned(title string, changes []string)
	Info(msg string)
	Warn(msg string)
}

// LockFunc takes the cluster lock for holder.
type LockFunc func(ctx context.Context, holder string) (*kube.Lock, error)

// ClusterLock takes kip's cluster lock (see kube.AcquireLock).
func ClusterLock(client kubernetes.Interface, opts kube.LockOptions) LockFunc {
	return func(ctx context.Context, holder string) (*kube.Lock, error) {
		return kube.AcquireLock(ctx, client, holder, opts)
	}
}

// Runner runs workflows for one kip command.
type Runner struct {
	// Dynamic reads and writes progress records. Nil keeps no record, for steps that run before
	// the cluster exists; such a workflow resumes by its checks alone.
	Dynamic dynamic.Interface
	// Lock takes the cluster lock for the whole run; nil takes none.
	Lock LockFunc
	// Held is a cluster lock the caller holds across several workflows: the run stops when it is
	// lost, but neither takes nor releases it. It replaces Lock.
	Held *kube.Lock
	// Holder describes who runs the command, see kube.HolderText.
	Holder string
	// KipVersion is recorded with the progress.
	KipVersion string
	Report     Reporter
	// DryRun takes no lock, writes nothing and applies nothing: each step says whether it is
	// done or what it would change, and the run ends with the plan.
	DryRun bool
}

// OnCluster is the Runner of a command's workflow on the cluster: its progress recorded, under
// the cluster lock, which names command (the command line) as its holder.
func OnCluster(cl *kube.Clients, command, kipVersion string, report Reporter) *Runner {
	return &Runner{
		Dynamic: cl.Dynamic, Lock: ClusterLock(cl.Kube, kube.LockOptions{}),
		Holder: kube.HolderText(command), KipVersion: kipVersion, Report: report,
	}
}

// TakeLock takes the cluster lock with r.Lock for r.Holder, saying when it took over a stale
// one; release releases it, warning when that fails. A command that must decide what to do under
// the lock takes it so and hands it to the run as Held.
func (r *Runner) TakeLock(ctx context.Context) (lock *kube.Lock, release func(), err error) {
	if lock, err = r.Lock(ctx, r.Holder); err != nil {
		return nil, nil, err
	}
	if lock.TookOverFrom != "" {
		r.Report.Warn(fmt.Sprintf("Took over the cluster lock from %s: %s", lock.TookOverFrom, lock.TookOverBecause))
	}
	return lock, func() {
		if err := lock.Release(ctx); err != nil {
			r.Report.Warn(fmt.Sprintf("%v (the lock frees itself about a minute after its last renewal)", err))
		}
	}, nil
}

// Status is where a recorded workflow stands.
type Status string

// Statuses of a progress record.
const (
	StatusRunning  Status = "running"  // between steps; Step comes next
	StatusApplying Status = "applying" // Step's Apply started
	StatusFailed   Status = "failed"   // Step failed with Error
	StatusStopped  Status = "stopped"  // stopped by the operator; Step comes next
	StatusFinished Status = "finished" // every step done
)

// Progress is the record kipper.run/op-<workflow>, format progressVersion.
type Progress struct {
	Workflow  string    `json:"workflow"`
	StartedBy string    `json:"startedBy"`
	StartedAt time.Time `json:"startedAt"`
	// KipVersion is the version of the kip that wrote the record last.
	KipVersion string `json:"kipVersion"`
	Status     Status `json:"status"`
	// Step is where the workflow resumes: the step being applied, that failed, or that is next.
	Step          string     `json:"step,omitempty"`
	StepStartedAt *time.Time `json:"stepStartedAt,omitempty"`
	Error         string     `json:"error,omitempty"`
	// Completed lists the steps found done or applied so far.
	Completed  []string        `json:"completed,omitempty"`
	Intent     json.RawMessage `json:"intent,omitempty"`
	UpdatedAt  time.Time       `json:"updatedAt"`
	FinishedAt *time.Time      `json:"finishedAt,omitempty"`
}

const (
	progressVersion = 1
	progressPrefix  = "op-"
	// saveTimeout bounds one record write; writes run detached from the run's cancellation so
	// that a stop or a failure is still recorded after Ctrl-C.
	saveTimeout = 30 * time.Second
	timeLayout  = time.DateTime + " MST"
)

// Forget removes the progress record of workflow name, unfinished or not: its operation was
// undone, and the next run of it starts afresh.
func Forget(ctx context.Context, dyn dynamic.Interface, records kube.ObjectRef, name string) error {
	return kube.DeleteRecord(ctx, dyn, records, progressPrefix+name)
}

// Unfinished returns the progress of workflow name recorded on the object (usually
// kube.ClusterRecords()) when it has not finished, nil otherwise, and decodes the intent it
// recorded into intent (when intent is not nil and one was recorded): what a command checks
// before it resumes, or runs again with other options.
func Unfinished(ctx context.Context, dyn dynamic.Interface, records kube.ObjectRef, name string, intent any) (*Progress, error) {
	p, found, err := kube.ReadRecord[Progress](ctx, dyn, records, progressPrefix+name, progressVersion)
	if err != nil || !found || p.Status == StatusFinished {
		return nil, err
	}
	if intent != nil && len(p.Intent) > 0 {
		if err := json.Unmarshal(p.Intent, intent); err != nil {
			return nil, fmt.Errorf("read what the unfinished %s recorded: %w", name, err)
		}
	}
	return &p, nil
}

// ListUnfinished returns the progress of every workflow recorded on the object (usually
// kube.ClusterRecords()) that has not finished, oldest first.
func ListUnfinished(ctx context.Context, dyn dynamic.Interface, records kube.ObjectRef) ([]Progress, error) {
	all, err := kube.ReadRecords[Progress](ctx, dyn, records, progressPrefix, progressVersion)
	if err != nil {
		return nil, err
	}
	var unfinished []Progress
	for _, p := range all {
		if p.Status != StatusFinished {
			unfinished = append(unfinished, p)
		}
	}
	sort.Slice(unfinished, func(i, j int) bool { return unfinished[i].StartedAt.Before(unfinished[j].StartedAt) })
	return unfinished, nil
}

// Run runs wf's steps in order, or plans them in a dry run.
func (r *Runner) Run(ctx context.Context, wf *Workflow) error {
	if err := wf.validate(); err != nil {
		return err
	}
	x := &run{r: r, wf: wf}
	if r.DryRun {
		return x.plan(ctx)
	}
	lock := r.Held
	if lock == nil && r.Lock != nil {
		var release func()
		var err error
		if lock, release, err = r.TakeLock(ctx); err != nil {
			return err
		}
		defer release()
	}
	if lock != nil {
		// Steps stop at once when the lock is lost: another kip may be changing the cluster.
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(ctx)
		defer cancel(nil)
		go func() {
			select {
			case <-lock.Lost():
				cancel(lock.Err())
			case <-ctx.Done():
			}
		}()
		x.lock = lock
	}
	resumed, err := x.load(ctx)
	if err != nil {
		return err
	}
	if resumed {
		x.reportResume("Resuming")
	}
	return x.apply(ctx)
}

// run is one Run of a workflow.
type run struct {
	r        *Runner
	wf       *Workflow
	lock     *kube.Lock
	p        Progress
	recorded bool // a progress record exists that this run must keep up to date
}

// load reads the workflow's progress record. An unfinished one is resumed: its intent is loaded
// into wf.Intent. Otherwise the run starts afresh.
func (x *run) load(ctx context.Context) (resumed bool, err error) {
	x.p = Progress{Workflow: x.wf.Name, StartedBy: x.r.Holder, StartedAt: time.Now(), Status: StatusRunning}
	if len(x.wf.Steps) > 0 {
		x.p.Step = x.wf.Steps[0].Name
	}
	if x.r.Dynamic == nil {
		return false, nil
	}
	p, found, err := kube.ReadRecord[Progress](ctx, x.r.Dynamic, x.wf.records(), progressPrefix+x.wf.Name, progressVersion)
	if err != nil || !found || p.Status == StatusFinished {
		return false, err
	}
	if x.wf.Intent != nil && len(p.Intent) > 0 {
		if err := json.Unmarshal(p.Intent, x.wf.Intent); err != nil {
			return false, fmt.Errorf("workflow %s: recorded intent: %w", x.wf.Name, err)
		}
	}
	x.p, x.recorded = p, true
	return true, nil
}

// reportResume says which unfinished run this one continues, and how its last attempt failed.
func (x *run) reportResume(verb string) {
	x.r.Report.Info(fmt.Sprintf("%s %s from step %s (started %s by %s)",
		verb, x.wf.Name, x.wf.title(x.p.Step), x.p.StartedAt.Local().Format(timeLayout), x.p.StartedBy))
	if x.p.Status == StatusFailed {
		x.r.Report.Info("Last attempt failed: " + x.p.Error)
	}
}

// plan is a dry run: it reads the progress record, checks and plans, and writes nothing.
func (x *run) plan(ctx context.Context) error {
	resumed, err := x.load(ctx)
	if err != nil {
		return err
	}
	if resumed {
		x.reportResume("Would resume")
	}
	var change, already int
	for _, s := range x.wf.Steps {
		if err := stop.Check(ctx); err != nil {
			return err
		}
		done, err := s.Check(ctx)
		if err != nil {
			return x.fail(ctx, s, fmt.Errorf("check: %w", err))
		}
		if done {
			already++
			x.r.Report.StepAlready(s.Already)
			continue
		}
		var changes []string
		if s.Plan != nil {
			if changes, err = s.Plan(ctx); err != nil {
				return x.fail(ctx, s, fmt.Errorf("plan: %w", err))
			}
		}
		change++
		x.r.Report.Planned(s.Title, changes)
	}
	x.r.Report.Info(fmt.Sprintf("Plan: %d to change, %d already done. Nothing was changed.", change, already))
	return nil
}

// apply runs the steps, recording intent before each Apply and progress after each step.
func (x *run) apply(ctx context.Context) error {
	last := len(x.wf.Steps) - 1
	for i, s := range x.wf.Steps {
		if err := x.interrupted(ctx, s, "Stopped before"); err != nil {
			return err
		}
		applied, err := x.step(ctx, s)
		if err != nil {
			return err
		}
		if !slices.Contains(x.p.Completed, s.Name) {
			x.p.Completed = append(x.p.Completed, s.Name)
		}
		if i == last {
			break // its record is the finished one below
		}
		// A step found done changed nothing: the next write records it.
		if applied {
			x.p.Status, x.p.Step, x.p.StepStartedAt = StatusRunning, x.wf.Steps[i+1].Name, nil
			if err := x.save(ctx); err != nil {
				return x.fail(ctx, s, err)
			}
		}
		faultPoint("done", &s)
	}
	finished := time.Now()
	x.p = Progress{
		Workflow: x.p.Workflow, StartedBy: x.p.StartedBy, StartedAt: x.p.StartedAt,
		Status: StatusFinished, FinishedAt: &finished,
	}
	if err := x.saveIfRecorded(ctx); err != nil {
		return fmt.Errorf("workflow %s: %w", x.wf.Name, err)
	}
	if last >= 0 {
		faultPoint("done", &x.wf.Steps[last])
	}
	return nil
}

// step runs one step: its Check, and when that finds it not done, its Apply, recorded before
// and checked after.
func (x *run) step(ctx context.Context, s Step) (applied bool, err error) {
	done, err := s.Check(ctx)
	if err != nil {
		return false, x.stepError(ctx, s, fmt.Errorf("check: %w", err))
	}
	if done {
		x.r.Report.StepAlready(s.Already)
		return false, nil
	}
	x.r.Report.StepStarted(s.Title)
	started := time.Now()
	x.p.Status, x.p.Step, x.p.StepStartedAt, x.p.Error = StatusApplying, s.Name, &started, ""
	if err := x.save(ctx); err != nil {
		return false, x.fail(ctx, s, err)
	}
	faultPoint("before", &s)
	if err := s.Apply(ctx); err != nil {
		return false, x.stepError(ctx, s, err)
	}
	faultPoint("after", &s)
	if done, err = s.Check(ctx); err != nil {
		return false, x.stepError(ctx, s, fmt.Errorf("check: %w", err))
	}
	if !done {
		msg := "reported success but its check still fails"
		if s.Plan != nil {
			// What it would still change says why.
			if changes, err := s.Plan(ctx); err == nil && len(changes) > 0 {
				msg += ": " + strings.Join(changes, "; ")
			}
		}
		return false, x.stepError(ctx, s, errors.New(msg))
	}
	x.r.Report.StepDone(s.Done, time.Since(started))
	return true, nil
}

// interrupted stops the run when the lock was lost or the operator asked to stop, recording
// where to resume.
func (x *run) interrupted(ctx context.Context, s Step, what string) error {
	if x.lock != nil && x.lock.Err() != nil {
		// Another kip may own the workflow now: write nothing more.
		return fmt.Errorf("step %s (%s): %w", s.Name, s.Title, x.lock.Err())
	}
	err := stop.Check(ctx)
	if err == nil {
		return nil
	}
	x.r.Report.Warn(fmt.Sprintf("%s %s. Run the same command again to continue.", what, s.Title))
	x.p.Status, x.p.Step = StatusStopped, s.Name
	return errors.Join(err, x.saveIfRecorded(ctx))
}

// stepError ends the run after step s returned err: stopped when the operator asked to stop or
// the lock was lost, failed otherwise.
func (x *run) stepError(ctx context.Context, s Step, err error) error {
	if stopped := x.interrupted(ctx, s, "Stopped during"); stopped != nil {
		return stopped
	}
	return x.fail(ctx, s, err)
}

// fail reports and records that step s failed with err.
func (x *run) fail(ctx context.Context, s Step, err error) error {
	x.r.Report.StepFailed(s.Title, err)
	err = fmt.Errorf("step %s: %w", s.Name, err)
	x.p.Status, x.p.Step, x.p.Error = StatusFailed, s.Name, err.Error()
	return errors.Join(err, x.saveIfRecorded(ctx))
}

func (x *run) saveIfRecorded(ctx context.Context) error {
	if !x.recorded {
		return nil
	}
	return x.save(ctx)
}

// save writes the progress record, with the workflow's current intent. A dry run, or a runner
// without a dynamic client, writes nothing.
func (x *run) save(ctx context.Context) error {
	if x.r.DryRun || x.r.Dynamic == nil {
		return nil
	}
	x.p.KipVersion, x.p.UpdatedAt = x.r.KipVersion, time.Now()
	if x.wf.Intent != nil {
		intent, err := json.Marshal(x.wf.Intent)
		if err != nil {
			return fmt.Errorf("record intent: %w", err)
		}
		x.p.Intent = intent
	}
	ctx, cancel := context.WithTimeout(fault.Bookkeeping(context.WithoutCancel(ctx)), saveTimeout)
	defer cancel()
	_, err := kube.UpdateRecord(ctx, x.r.Dynamic, x.wf.records(), progressPrefix+x.wf.Name, progressVersion,
		func(p *Progress, _ bool) error {
			*p = x.p
			return nil
		})
	if err != nil {
		return err
	}
	x.recorded = true
	return nil
}
