package workflow_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/stop"
	"kipper.run/kip/internal/workflow"
	"kipper.run/kip/test/testenv"
)

// finalState is what every complete run of the demo leaves behind.
var finalState = map[string]map[string]string{
	"config":    {"color": "blue", "app": "app"},
	"app":       {"replicas": "3"},
	"ready":     {"ready": "true"},
	appliesName: {"create-config": "1", "create-app": "1", "scale-app": "1", "link-config": "1", "mark-ready": "1"},
}

func assertFinished(t *testing.T, client kubernetes.Interface, dyn dynamic.Interface, ns string, want map[string]map[string]string) {
	t.Helper()
	if got := state(t, client, ns); !equalState(got, want) {
		t.Errorf("end state:\n got %v\nwant %v", got, want)
	}
	p, found := progress(t, dyn, ns)
	if !found || p.Status != workflow.StatusFinished || p.FinishedAt == nil || p.Step != "" || len(p.Completed) != 0 {
		t.Errorf("progress record = %+v (found %v), want a small finished record", p, found)
	}
	assertLockFree(t, client, ns)
}

func equalState(a, b map[string]map[string]string) bool {
	return maps.EqualFunc(a, b, func(x, y map[string]string) bool { return maps.Equal(x, y) })
}

// assertLockFree takes and releases the lock: it must be free, not stale.
func assertLockFree(t *testing.T, client kubernetes.Interface, ns string) {
	t.Helper()
	l, err := kube.AcquireLock(t.Context(), client, "kip test by checker@host, pid 2", kube.LockOptions{Namespace: ns, LeaseDuration: leaseDuration})
	if err != nil {
		t.Fatalf("lock after the run: %v", err)
	}
	defer l.Release(t.Context())
	if l.TookOverFrom != "" {
		t.Errorf("the run left its lock for a takeover instead of releasing it")
	}
}

func TestRunOutput(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	client, dyn := clients(t, env.Config)
	d := newDemo(client, ns)
	if err := d.create(t.Context(), "config", map[string]string{"color": "blue"}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := newRunner(client, dyn, ns, testHolder, &out).Run(t.Context(), d.workflow()); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	golden(t, "run", out.String())
	want := maps.Clone(finalState)
	want[appliesName] = map[string]string{"create-app": "1", "scale-app": "1", "link-config": "1", "mark-ready": "1"}
	assertFinished(t, client, dyn, ns, want)

	// Running it again changes nothing and says so.
	out.Reset()
	if err := newRunner(client, dyn, ns, testHolder, &out).Run(t.Context(), newDemo(client, ns).workflow()); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "Resuming") || strings.Count(out.String(), "already") != 5 {
		t.Errorf("second run printed:\n%s", out.String())
	}
	assertFinished(t, client, dyn, ns, want)
}

// TestDryRunChangesNothing plans an unfinished run: it takes no lock and leaves every object in
// the namespace, the progress record included, exactly as it was.
func TestDryRunChangesNothing(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	client, dyn := clients(t, env.Config)
	d := newDemo(client, ns)
	d.fail["scale-app"] = errors.New("boom")
	if err := newRunner(client, dyn, ns, testHolder, &bytes.Buffer{}).Run(t.Context(), d.workflow()); err == nil {
		t.Fatal("the failing run succeeded")
	}

	before := snapshot(t, client, dyn, ns)
	var out bytes.Buffer
	r := newRunner(client, dyn, ns, "kip demo --dry-run by tester@host, pid 3", &out)
	r.DryRun = true
	r.Lock = func(context.Context, string) (*kube.Lock, error) {
		t.Error("a dry run took the lock")
		return nil, errors.New("no lock in a dry run")
	}
	if err := r.Run(t.Context(), newDemo(client, ns).workflow()); err != nil {
		t.Fatalf("dry run: %v\n%s", err, out.String())
	}
	golden(t, "plan", out.String())
	after := snapshot(t, client, dyn, ns)
	if !maps.Equal(before, after) {
		for k, v := range after {
			if before[k] != v {
				t.Errorf("%s changed or appeared in the dry run", k)
			}
		}
		for k := range before {
			if _, ok := after[k]; !ok {
				t.Errorf("%s disappeared in the dry run", k)
			}
		}
	}
}

// snapshot returns every object in ns, of every listable resource, plus the cluster lock's
// namespace objects, as "resource namespace/name" → the object's JSON (which holds its
// resourceVersion).
func snapshot(t *testing.T, client kubernetes.Interface, dyn dynamic.Interface, ns string) map[string]string {
	t.Helper()
	lists, err := client.Discovery().ServerPreferredNamespacedResources()
	if err != nil {
		t.Fatal(err)
	}
	objects := map[string]string{}
	for _, list := range lists {
		gv, err := schema.ParseGroupVersion(list.GroupVersion)
		if err != nil {
			t.Fatal(err)
		}
		for _, res := range list.APIResources {
			if !strings.Contains(strings.Join(res.Verbs, " "), "list") || res.Name == "events" {
				continue // events are the API server's log, not state
			}
			items, err := dyn.Resource(gv.WithResource(res.Name)).Namespace(ns).List(t.Context(), metav1.ListOptions{})
			if err != nil {
				t.Fatalf("list %s: %v", res.Name, err)
			}
			for _, item := range items.Items {
				data, err := json.Marshal(item.Object)
				if err != nil {
					t.Fatal(err)
				}
				objects[res.Name+"."+gv.Group+" "+ns+"/"+item.GetName()] = string(data)
			}
		}
	}
	if len(objects) == 0 {
		t.Fatal("snapshot found no objects")
	}
	return objects
}

// TestStopBetweenSteps: Ctrl-C during a step lets the step finish, stops before the next one,
// records where to resume and frees the lock; running again continues there.
func TestStopBetweenSteps(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	client, dyn := clients(t, env.Config)
	ctx, requestStop := stop.WithRequest(t.Context())
	d := newDemo(client, ns)
	d.hook = func(point string) {
		if point == "applied:create-app" {
			requestStop()
		}
	}
	var out bytes.Buffer
	err := newRunner(client, dyn, ns, testHolder, &out).Run(ctx, d.workflow())
	if !errors.Is(err, stop.ErrInterrupted) {
		t.Fatalf("run error = %v, want stop.ErrInterrupted", err)
	}
	p, _ := progress(t, dyn, ns)
	if p.Status != workflow.StatusStopped || p.Step != "scale-app" || strings.Join(p.Completed, ",") != "create-config,create-app" {
		t.Errorf("record after the stop = %+v", p)
	}
	assertLockFree(t, client, ns)

	out.WriteString("--- run again\n")
	if err := newRunner(client, dyn, ns, testHolder, &out).Run(t.Context(), newDemo(client, ns).workflow()); err != nil {
		t.Fatalf("second run: %v\n%s", err, out.String())
	}
	golden(t, "stop", out.String())
	assertFinished(t, client, dyn, ns, finalState)
}

// TestApplyErrorIsRecordedAndRetried: a failed Apply is printed, recorded with its error, and
// retried by the next run.
func TestApplyErrorIsRecordedAndRetried(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	client, dyn := clients(t, env.Config)
	d := newDemo(client, ns)
	d.fail["link-config"] = errors.New("connection refused")
	var out bytes.Buffer
	err := newRunner(client, dyn, ns, testHolder, &out).Run(t.Context(), d.workflow())
	if err == nil || err.Error() != "step link-config: connection refused" {
		t.Fatalf("run error = %v", err)
	}
	if !strings.Contains(out.String(), "✗ Link config to app: connection refused\n") {
		t.Errorf("output:\n%s", out.String())
	}
	p, _ := progress(t, dyn, ns)
	if p.Status != workflow.StatusFailed || p.Step != "link-config" || p.Error != "step link-config: connection refused" {
		t.Errorf("record after the failure = %+v", p)
	}
	assertLockFree(t, client, ns)

	out.Reset()
	if err := newRunner(client, dyn, ns, testHolder, &out).Run(t.Context(), newDemo(client, ns).workflow()); err != nil {
		t.Fatalf("second run: %v\n%s", err, out.String())
	}
	for _, want := range []string{
		"Resuming demo from step Link config to app (started ",
		"Last attempt failed: step link-config: connection refused",
		"✔ Linked config to app (",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("second run's output lacks %q:\n%s", want, out.String())
		}
	}
	assertFinished(t, client, dyn, ns, finalState)
}

func TestCheckAfterApplyFails(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	client, dyn := clients(t, env.Config)
	d := newDemo(client, ns)
	d.noop["scale-app"] = true
	err := newRunner(client, dyn, ns, testHolder, &bytes.Buffer{}).Run(t.Context(), d.workflow())
	// The failure says what the step would still change (its Plan).
	const want = "step scale-app: reported success but its check still fails: set replicas of ConfigMap app to 3"
	if err == nil || err.Error() != want {
		t.Fatalf("run error = %v, want %s", err, want)
	}
	if p, _ := progress(t, dyn, ns); p.Status != workflow.StatusFailed || p.Step != "scale-app" || p.Error != want {
		t.Errorf("record = %+v", p)
	}
	if err := newRunner(client, dyn, ns, testHolder, &bytes.Buffer{}).Run(t.Context(), newDemo(client, ns).workflow()); err != nil {
		t.Fatal(err)
	}
	assertFinished(t, client, dyn, ns, finalState)
}

// TestIntentPersistsAcrossResume: the intent is recorded before the step that acts on it, and a
// resumed run acts on the recorded intent, not on what the new run would have chosen.
func TestIntentPersistsAcrossResume(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	client, dyn := clients(t, env.Config)
	d := newDemo(client, ns)
	d.intent.Replicas = 5
	d.hook = func(point string) {
		if point != "apply:scale-app" {
			return
		}
		p, _ := progress(t, dyn, ns)
		var intent demoIntent
		if err := json.Unmarshal(p.Intent, &intent); err != nil || intent.Replicas != 5 ||
			p.Status != workflow.StatusApplying || p.Step != "scale-app" || p.StepStartedAt == nil || p.KipVersion != kipVersion {
			t.Errorf("record when scale-app's Apply starts = %+v (intent %s)", p, p.Intent)
		}
	}
	d.fail["link-config"] = errors.New("boom")
	if err := newRunner(client, dyn, ns, testHolder, &bytes.Buffer{}).Run(t.Context(), d.workflow()); err == nil {
		t.Fatal("the failing run succeeded")
	}
	if err := client.CoreV1().ConfigMaps(ns).Delete(t.Context(), "app", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	again := newDemo(client, ns) // would choose 3 replicas
	if err := newRunner(client, dyn, ns, testHolder, &bytes.Buffer{}).Run(t.Context(), again.workflow()); err != nil {
		t.Fatal(err)
	}
	if again.intent.Replicas != 5 {
		t.Errorf("resumed intent = %+v, want the recorded 5 replicas", again.intent)
	}
	if got := state(t, client, ns)["app"]["replicas"]; got != "5" {
		t.Errorf("app replicas = %s, want 5", got)
	}
	p, _ := progress(t, dyn, ns)
	if string(p.Intent) != `{"replicas":5}` {
		t.Errorf("finished record's intent = %s", p.Intent)
	}
}

func TestLockHeldRefusesRun(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	client, dyn := clients(t, env.Config)
	other := "kip node remove w2 by bob@desk, pid 7"
	l, err := kube.AcquireLock(t.Context(), client, other, kube.LockOptions{Namespace: ns, LeaseDuration: leaseDuration})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(t.Context())
	err = newRunner(client, dyn, ns, testHolder, &bytes.Buffer{}).Run(t.Context(), newDemo(client, ns).workflow())
	var held *kube.LockHeldError
	if !errors.As(err, &held) || held.Holder != other {
		t.Fatalf("run error = %v, want the lock held by %s", err, other)
	}
	if got := state(t, client, ns); len(got) != 0 {
		t.Errorf("a refused run changed %v", got)
	}
	if _, found := progress(t, dyn, ns); found {
		t.Error("a refused run wrote a progress record")
	}
}

// TestLockLostStopsRun: when another kip takes the lock during a step, the step's context ends
// and the run stops without writing over the record.
func TestLockLostStopsRun(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	client, dyn := clients(t, env.Config)
	d := newDemo(client, ns)
	thief := "kip node fence w3 by eve@host, pid 8"
	d.extra = []workflow.Step{{
		Name: "long", Title: "Run a long command", Done: "Ran a long command", Already: "long command already run",
		Check: func(context.Context) (bool, error) { return false, nil },
		Apply: func(ctx context.Context) error {
			leases := client.CoordinationV1().Leases(ns)
			if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
				lease, err := leases.Get(ctx, kube.LockName, metav1.GetOptions{})
				if err != nil {
					return err
				}
				lease.Spec.HolderIdentity = &thief
				lease.Annotations[kube.LockTokenAnnotation] = "thief"
				_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
				return err
			}); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Minute): // the lock is renewed, and its loss seen, every 5 s
				return errors.New("the step's context outlived the lock")
			}
		},
	}}
	err := newRunner(client, dyn, ns, testHolder, &bytes.Buffer{}).Run(t.Context(), d.workflow())
	// The error names the step it stopped (and kip install names the host around it).
	if want := "step long (Run a long command): lost the cluster lock: it was taken over by " + thief; err == nil || err.Error() != want {
		t.Fatalf("run error = %v, want %s", err, want)
	}
	if p, _ := progress(t, dyn, ns); p.Status != workflow.StatusApplying || p.Step != "long" {
		t.Errorf("record = %+v, want it left as the lost run had written it", p)
	}
}

func TestListUnfinished(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	client, dyn := clients(t, env.Config)
	d := newDemo(client, ns)
	d.fail["create-app"] = errors.New("boom")
	if err := newRunner(client, dyn, ns, testHolder, &bytes.Buffer{}).Run(t.Context(), d.workflow()); err == nil {
		t.Fatal("the failing run succeeded")
	}
	finished := newDemo(client, ns).workflow()
	finished.Name = "other"
	if err := newRunner(client, dyn, ns, testHolder, &bytes.Buffer{}).Run(t.Context(), finished); err != nil {
		t.Fatal(err)
	}
	list, err := workflow.ListUnfinished(t.Context(), dyn, kube.ConfigMapRef(ns, "kipper-records"))
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Workflow != "demo" || list[0].Status != workflow.StatusFailed || list[0].StartedBy != testHolder {
		t.Errorf("unfinished = %+v, want the failed demo only", list)
	}
	// One workflow by its name: the failed demo with its intent; the finished one and one never
	// run are not unfinished.
	records := kube.ConfigMapRef(ns, "kipper-records")
	var intent demoIntent
	if p, err := workflow.Unfinished(t.Context(), dyn, records, "demo", &intent); err != nil || p == nil || p.Status != workflow.StatusFailed || intent.Replicas != 3 {
		t.Errorf("Unfinished(demo) = %+v, intent %+v, %v; want the failed run and its 3 replicas", p, intent, err)
	}
	for _, name := range []string{"other", "never"} {
		if p, err := workflow.Unfinished(t.Context(), dyn, records, name, nil); err != nil || p != nil {
			t.Errorf("Unfinished(%s) = %+v, %v; want none", name, p, err)
		}
	}
}

// TestRunWithoutRecords: a runner with no API client (steps before the cluster exists) keeps
// no record and takes no lock.
func TestRunWithoutRecords(t *testing.T) {
	var applied []string
	step := func(name string) workflow.Step {
		done := false
		return workflow.Step{
			Name: name, Title: "Do " + name, Done: "Did " + name, Already: name + " already done",
			Check: func(context.Context) (bool, error) { return done, nil },
			Apply: func(context.Context) error {
				done = true
				applied = append(applied, name)
				return nil
			},
		}
	}
	var out bytes.Buffer
	r := newRunner(nil, nil, "", testHolder, &out)
	r.Dynamic, r.Lock = nil, nil
	if err := r.Run(t.Context(), &workflow.Workflow{Name: "host", Steps: []workflow.Step{step("a"), step("b")}}); err != nil {
		t.Fatal(err)
	}
	if strings.Join(applied, ",") != "a,b" {
		t.Errorf("applied %v", applied)
	}
}

func TestInvalidWorkflowIsRefused(t *testing.T) {
	noop := func(context.Context) error { return nil }
	check := func(context.Context) (bool, error) { return false, nil }
	for _, tc := range []struct {
		steps []workflow.Step
		want  string
	}{
		{[]workflow.Step{{Name: "a", Check: check, Apply: noop}, {Name: "a", Check: check, Apply: noop}}, "workflow w: two steps are named a"},
		{[]workflow.Step{{Name: "a", Apply: noop}}, "workflow w: step a needs both Check and Apply"},
		{[]workflow.Step{{Check: check, Apply: noop}}, "workflow w: a step has no name"},
	} {
		r := &workflow.Runner{Report: newRunner(nil, nil, "", testHolder, &bytes.Buffer{}).Report}
		if err := r.Run(t.Context(), &workflow.Workflow{Name: "w", Steps: tc.steps}); err == nil || err.Error() != tc.want {
			t.Errorf("error = %v, want %s", err, tc.want)
		}
	}
}

// TestHeldLockSpansWorkflows: with Held, two workflows run under one lock the caller holds; the
// runner neither takes it again nor releases it, so no other command can slip in between them.
func TestHeldLockSpansWorkflows(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	client, dyn := clients(t, env.Config)
	held, err := kube.AcquireLock(t.Context(), client, testHolder, kube.LockOptions{Namespace: ns, LeaseDuration: leaseDuration})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"first", "second"} {
		r := newRunner(client, dyn, ns, testHolder, &bytes.Buffer{})
		r.Held = held
		wf := &workflow.Workflow{Name: name, Steps: []workflow.Step{{
			Name: "noop", Title: "Do nothing", Done: "Did nothing", Already: "Nothing to do",
			Check: func(context.Context) (bool, error) { return true, nil },
			Apply: func(context.Context) error { return nil },
		}}}
		if err := r.Run(t.Context(), wf); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		other, err := kube.AcquireLock(t.Context(), client, "kip test by other@host, pid 3", kube.LockOptions{Namespace: ns, LeaseDuration: leaseDuration})
		if err == nil {
			other.Release(t.Context()) //nolint:errcheck // the test fails anyway
			t.Fatalf("after %s, another command took the lock the caller holds", name)
		}
	}
	if err := held.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	assertLockFree(t, client, ns)
}
