package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/app"
	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/service"
	consolestandin "kipper.run/kip/test/console-standin"
	"kipper.run/kip/test/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

type fixture struct {
	cl     *kube.Clients
	out    *bytes.Buffer
	errOut *bytes.Buffer
	opts   service.Options
}

// setup starts the console stand-in against the test environment, with one kwok node for the
// apps' pods, and creates project p with environment e.
func setup(ctx context.Context, t *testing.T, node, p, e string) *fixture {
	t.Helper()
	env := testenv.Get(t)
	cl, err := kube.NewClients(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	env.AddNode(t, node, testenv.NodeOptions{Labels: map[string]string{"kip-test": node}})
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	s := &consolestandin.Standin{Kube: cl.Kube, Dynamic: cl.Dynamic, Image: "kip.invalid/app", Interval: time.Second, Logf: t.Logf}
	go func() { defer close(done); s.Run(sctx) }()
	t.Cleanup(func() { stop(); <-done })
	f := &fixture{cl: cl, out: &bytes.Buffer{}, errOut: &bytes.Buffer{}}
	ios := &cli.IOStreams{Out: f.out, ErrOut: f.errOut, Getenv: func(string) string { return "" }}
	f.opts = service.Options{Kube: func() (*kube.Clients, error) { return cl, nil }, Printer: cli.NewPrinter(ios),
		Prompter: cli.NewPrompter(ios, true), Out: f.out}
	project := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Project",
		"metadata": map[string]any{"name": p}, "spec": map[string]any{"environments": []any{map[string]any{"name": e}}}}}
	if _, err := cl.Dynamic.Resource(service.ProjectsGVR).Create(ctx, project, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.Poll(ctx, time.Minute, "namespace "+p+"-"+e, func(ctx context.Context) (bool, string, error) {
		_, err := cl.Kube.CoreV1().Namespaces().Get(ctx, p+"-"+e, metav1.GetOptions{})
		return err == nil, "", ignoreNotFound(err)
	}); err != nil {
		t.Fatal(err)
	}
	return f
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// app creates App ref with spec, as the console does, and waits until it runs.
func (f *fixture) app(ctx context.Context, t *testing.T, ref service.Ref, spec map[string]any) {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "App",
		"metadata": map[string]any{"name": ref.Name, "namespace": ref.Namespace()}, "spec": spec}}
	if _, err := f.cl.Dynamic.Resource(app.AppsGVR).Namespace(ref.Namespace()).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.PollPending(ctx, time.Minute, "app "+ref.String()+" to run", func(ctx context.Context) (string, error) {
		return app.RunningPending(ctx, f.cl, ref)
	}); err != nil {
		t.Fatal(err)
	}
	f.phase(ctx, t, ref, app.PhaseRunning)
}

// phase waits until the stand-in reports App ref in phase for its current generation.
func (f *fixture) phase(ctx context.Context, t *testing.T, ref service.Ref, phase string) *app.App {
	t.Helper()
	var a *app.App
	if err := kube.PollPending(ctx, time.Minute, "app "+ref.String()+" "+phase, func(ctx context.Context) (string, error) {
		var err error
		if a, err = app.Get(ctx, f.cl.Dynamic, ref); err != nil || a.PendingObserved() != "" {
			return "not observed yet", err
		}
		if a.Phase != phase {
			return "phase " + a.Phase, nil
		}
		return "", nil
	}); err != nil {
		t.Fatal(err)
	}
	return a
}

func (f *fixture) get(ctx context.Context, t *testing.T, ref service.Ref) *app.App {
	t.Helper()
	a, err := app.Get(ctx, f.cl.Dynamic, ref)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func (f *fixture) deployment(ctx context.Context, t *testing.T, ref service.Ref) *appsv1.Deployment {
	t.Helper()
	d, err := f.cl.Kube.AppsV1().Deployments(ref.Namespace()).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// acted waits until the stand-in has acted on the App's current generation.
func (f *fixture) acted(ctx context.Context, t *testing.T, ref service.Ref) *app.App {
	t.Helper()
	var a *app.App
	if err := kube.PollPending(ctx, time.Minute, "the stand-in to act on app "+ref.String(), func(ctx context.Context) (string, error) {
		var err error
		a, err = app.Get(ctx, f.cl.Dynamic, ref)
		if err != nil {
			return "", err
		}
		return a.PendingObserved(), nil
	}); err != nil {
		t.Fatal(err)
	}
	return a
}

// written is what kip writes of App ref, its generation, spec and annotations (not its status,
// which the stand-in writes), to tell that a command wrote nothing.
func (f *fixture) written(ctx context.Context, t *testing.T, ref service.Ref) string {
	t.Helper()
	a := f.get(ctx, t, ref)
	raw, err := json.Marshal([]any{a.Object.GetGeneration(), a.Object.Object["spec"], a.Object.GetAnnotations()})
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// messages returns what the printer wrote since the last call.
func (f *fixture) messages() string {
	s := f.errOut.String()
	f.errOut.Reset()
	return s
}

func contains(t *testing.T, what, got string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("%s lacks %q:\n%s", what, w, got)
		}
	}
}

func refused(t *testing.T, what string, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: not refused", what)
		return
	}
	contains(t, what, err.Error(), want...)
}

// TestAppCommands drives every kip app command against the real API server, with the console
// stand-in turning the App into a Deployment and kwok running its pods: each command's write, the
// Deployment's count that follows, its refusals, and no write when nothing changes.
func TestAppCommands(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	f := setup(ctx, t, "app-node", "shop", "test")
	web := service.Ref{Project: "shop", Environment: "test", Name: "web"}
	f.app(ctx, t, web, map[string]any{"image": "registry.example/web:1", "replicas": int64(2)})
	o := &app.AppOptions{Options: f.opts, Ref: web}
	flags := "web --project shop --environment test"

	// info, as text and as JSON.
	if err := app.ShowInfo(ctx, o); err != nil {
		t.Fatal(err)
	}
	contains(t, "info", f.out.String(), "App:          web (image registry.example/web:1)\n",
		"Project:      shop, environment test (namespace shop-test)\n", "State:        Running\n",
		"Replicas:     2 stored; Deployment web set to 2, 2 ready\n", "Autoscaling:  off, bounds 1 or more\n",
		"Runs on:      node app-node (pod web-")
	f.out.Reset()
	jo := *o
	jo.JSON = true
	if err := app.ShowInfo(ctx, &jo); err != nil {
		t.Fatal(err)
	}
	var info app.Info
	if err := json.Unmarshal(f.out.Bytes(), &info); err != nil {
		t.Fatalf("info -o json: %v\n%s", err, f.out)
	}
	if info.App != "web" || info.Image != "registry.example/web:1" || info.Replicas != 2 || info.Stop != nil || info.Phase != app.PhaseRunning ||
		info.Deployment == nil || info.Deployment.Desired != 2 || info.Deployment.Ready != 2 || len(info.Pods) != 2 || info.Pods[0].Node != "app-node" || !info.Pods[0].Ready {
		t.Errorf("info -o json: %s", f.out)
	}
	f.out.Reset()

	// A missing app names what to check.
	refused(t, "a missing app", app.ShowInfo(ctx, &app.AppOptions{Options: f.opts, Ref: service.Ref{Project: "shop", Environment: "test", Name: "nope"}}),
		"no app nope in shop-test (project shop, environment test; apps there: web): check the name with kubectl get apps.kipper.run -n shop-test")
	refused(t, "a missing environment", app.ShowInfo(ctx, &app.AppOptions{Options: f.opts, Ref: service.Ref{Project: "shop", Environment: "prod", Name: "web"}}),
		`project shop has no environment "prod" (environments: test)`)

	// scale: the count is written and the Deployment follows.
	if err := app.Scale(ctx, &app.ScaleOptions{AppOptions: *o, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	if a, d := f.get(ctx, t, web), f.deployment(ctx, t, web); a.Replicas != 3 || *d.Spec.Replicas != 3 || d.Status.ReadyReplicas != 3 {
		t.Fatalf("after scale 3: stored %d, Deployment %d with %d ready", a.Replicas, *d.Spec.Replicas, d.Status.ReadyReplicas)
	}
	contains(t, "scale", f.messages(), "Scaled app web in shop-test to 3 replicas")
	// The same count again writes nothing.
	before := f.written(ctx, t, web)
	if err := app.Scale(ctx, &app.ScaleOptions{AppOptions: *o, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	contains(t, "scale to the same count", f.messages(), "App web in shop-test already stores 3 replicas")
	if after := f.written(ctx, t, web); after != before {
		t.Errorf("scale to the same count wrote the App:\n%s\n→ %s", before, after)
	}
	// 0 lies outside the bounds: stop the app instead.
	refused(t, "scale 0", app.Scale(ctx, &app.ScaleOptions{AppOptions: *o, Replicas: 0}),
		"cannot scale app web in shop-test to 0: its stored count must lie within its autoscaling bounds of 1 or more, whether autoscaling is on or off; set a count with N of 1 or more, or change the bounds with 'kip app autoscale "+flags+" --off --min N --max M'; to run no pod, stop the app with 'kip app stop "+flags+"'")
	var usage *cli.UsageError
	if err := app.Scale(ctx, &app.ScaleOptions{AppOptions: *o, Replicas: -1}); err == nil || !errors.As(err, &usage) {
		t.Errorf("scale -1: %v, want a usage error", err)
	}

	// autoscale on: the block is written; the count within the bounds stays.
	if err := app.SetAutoscale(ctx, &app.AutoscaleOptions{AppOptions: *o, Min: ptr.To[int32](2), Max: ptr.To[int32](4), CPUTarget: ptr.To[int32](70)}); err != nil {
		t.Fatal(err)
	}
	a := f.acted(ctx, t, web)
	if want := (app.Autoscale{Enabled: true, Min: ptr.To[int32](2), Max: ptr.To[int32](4), CPUTarget: ptr.To[int32](70)}); a.Autoscale.Describe() != want.Describe() || a.Replicas != 3 {
		t.Fatalf("after autoscale: %s, stored %d", a.Autoscale.Describe(), a.Replicas)
	}
	if d := f.deployment(ctx, t, web); *d.Spec.Replicas != 3 {
		t.Errorf("the Deployment moved within the bounds: %d, want 3", *d.Spec.Replicas)
	}
	contains(t, "autoscale", f.messages(), "Set the autoscaling of app web in shop-test: on, bounds 2 to 4, CPU target 70%",
		"autoscaling: off → on", "minReplicas: (unset) → 2", "maxReplicas: (unset) → 4", "cpuTarget: (unset) → 70")
	// Bounds that leave the stored count outside move it, and the running count with them.
	if err := app.SetAutoscale(ctx, &app.AutoscaleOptions{AppOptions: *o, Min: ptr.To[int32](4), Max: ptr.To[int32](6)}); err != nil {
		t.Fatal(err)
	}
	if a, d := f.get(ctx, t, web), f.deployment(ctx, t, web); a.Replicas != 4 || *d.Spec.Replicas != 4 || d.Status.ReadyReplicas != 4 {
		t.Fatalf("after autoscale 4 to 6: stored %d, Deployment %d with %d ready", a.Replicas, *d.Spec.Replicas, d.Status.ReadyReplicas)
	}
	contains(t, "autoscale 4 to 6", f.messages(), "replicas: 3 → 4 (the stored count, into the bounds)", "The stored count moved from 3 to 4, into the bounds of 4 to 6.")
	// The rules refuse an invalid block, naming the rule, and nothing is written.
	before = f.written(ctx, t, web)
	for _, tc := range []struct {
		o    app.AutoscaleOptions
		want string
	}{
		{app.AutoscaleOptions{Min: ptr.To[int32](7)}, "cannot set the autoscaling of app web in shop-test to on, bounds 7 to 6, CPU target 70%: its minimum 7 is above its maximum 6"},
		{app.AutoscaleOptions{Min: ptr.To[int32](0)}, "its minimum 0 is below 1"},
		{app.AutoscaleOptions{CPUTarget: ptr.To[int32](0)}, "autoscaling is on without a target"},
		{app.AutoscaleOptions{MemoryTarget: ptr.To[int32](-5)}, "autoscaling is on with a negative target"},
	} {
		tc.o.AppOptions = *o
		refused(t, fmt.Sprintf("autoscale %+v", tc.o), app.SetAutoscale(ctx, &tc.o), tc.want)
	}
	if err := app.SetAutoscale(ctx, &app.AutoscaleOptions{AppOptions: *o, Off: true, CPUTarget: ptr.To[int32](50)}); err == nil || !errors.As(err, &usage) {
		t.Errorf("--off with a target: %v, want a usage error", err)
	}
	if err := app.SetAutoscale(ctx, &app.AutoscaleOptions{AppOptions: *o}); err == nil || !errors.As(err, &usage) {
		t.Errorf("autoscale without flags: %v, want a usage error", err)
	}
	// scale with autoscaling on: within the bounds only; the autoscaler keeps the running count.
	refused(t, "scale 8 outside 4 to 6", app.Scale(ctx, &app.ScaleOptions{AppOptions: *o, Replicas: 8}),
		"its autoscaling bounds of 4 to 6", "set a count with N from 4 to 6, or change the bounds with 'kip app autoscale "+flags+" --min N --max M'")
	if after := f.written(ctx, t, web); after != before {
		t.Errorf("a refused command wrote the App:\n%s\n→ %s", before, after)
	}
	if err := app.Scale(ctx, &app.ScaleOptions{AppOptions: *o, Replicas: 5}); err != nil {
		t.Fatal(err)
	}
	contains(t, "scale with autoscaling on", f.messages(), "Stored 5 replicas for app web in shop-test (was 4)",
		"Autoscaling is on: the autoscaler moves the running count within the bounds of 4 to 6.")
	if a := f.acted(ctx, t, web); a.Replicas != 5 {
		t.Errorf("stored %d after scale 5, want 5", a.Replicas)
	}
	if d := f.deployment(ctx, t, web); *d.Spec.Replicas != 4 {
		t.Errorf("with autoscaling on the Deployment follows the autoscaler, not the stored count: %d, want 4", *d.Spec.Replicas)
	}
	// autoscale --off: the bounds stay, the app runs its stored count.
	if err := app.SetAutoscale(ctx, &app.AutoscaleOptions{AppOptions: *o, Off: true}); err != nil {
		t.Fatal(err)
	}
	if a, d := f.get(ctx, t, web), f.deployment(ctx, t, web); a.Autoscale.Enabled || a.Autoscale.Bounds().String() != "4 to 6" || ptr.Deref(a.Autoscale.CPUTarget, 0) != 70 ||
		*d.Spec.Replicas != 5 || d.Status.ReadyReplicas != 5 {
		t.Fatalf("after autoscale --off: %s, Deployment %d with %d ready", a.Autoscale.Describe(), *d.Spec.Replicas, d.Status.ReadyReplicas)
	}
	f.messages()
	before = f.written(ctx, t, web)
	if err := app.SetAutoscale(ctx, &app.AutoscaleOptions{AppOptions: *o, Off: true}); err != nil {
		t.Fatal(err)
	}
	contains(t, "autoscale --off again", f.messages(), "App web in shop-test's autoscaling is already off, bounds 4 to 6, CPU target 70%")
	if after := f.written(ctx, t, web); after != before {
		t.Errorf("autoscale --off again wrote the App:\n%s\n→ %s", before, after)
	}

	// restart: console-api puts the request on the pod template; every pod left carries it.
	if err := app.Restart(ctx, o); err != nil {
		t.Fatal(err)
	}
	requested := f.get(ctx, t, web).Restart
	if _, err := time.Parse(time.RFC3339, requested); err != nil {
		t.Errorf("the restart request %q: %v", requested, err)
	}
	d := f.deployment(ctx, t, web)
	if d.Spec.Template.Annotations[app.RestartedAnnotation] != requested || *d.Spec.Replicas != 5 || d.Status.UpdatedReplicas != 5 || d.Status.ReadyReplicas != 5 {
		t.Errorf("after restart: the template's %s %q (want %q), %d replicas, %d updated, %d ready", app.RestartedAnnotation,
			d.Spec.Template.Annotations[app.RestartedAnnotation], requested, *d.Spec.Replicas, d.Status.UpdatedReplicas, d.Status.ReadyReplicas)
	}
	a = f.get(ctx, t, web)
	pods, err := app.Pods(ctx, f.cl.Kube, a, d)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if p.DeletionTimestamp == nil && p.Annotations[app.RestartedAnnotation] != requested {
			t.Errorf("pod %s was not rolled: %s %q", p.Name, app.RestartedAnnotation, p.Annotations[app.RestartedAnnotation])
		}
	}
	contains(t, "restart", f.messages(), "Restarted app web in shop-test: its pods rolled")

	// stop: the stop is recorded, the Deployment goes to 0 and no pod is left.
	if err := app.Stop(ctx, o); err != nil {
		t.Fatal(err)
	}
	a = f.get(ctx, t, web)
	if a.Stop == nil || a.Stop.Reason != app.StopReason {
		t.Fatalf("after stop: %+v", a.Stop)
	}
	if at, err := time.Parse(time.RFC3339, a.Stop.At); err != nil || time.Since(at) > 5*time.Minute {
		t.Errorf("the stop's time %q: %v", a.Stop.At, err)
	}
	d = f.deployment(ctx, t, web)
	if pods, err := app.Pods(ctx, f.cl.Kube, a, d); err != nil || len(pods) != 0 || *d.Spec.Replicas != 0 {
		t.Fatalf("after stop: Deployment %d, %d pods, %v", *d.Spec.Replicas, len(pods), err)
	}
	contains(t, "stop", f.messages(), "Stopped app web in shop-test", "It stays stopped until 'kip app start "+flags+"'.")
	f.phase(ctx, t, web, app.PhaseStopped)
	before = f.written(ctx, t, web)
	if err := app.Stop(ctx, o); err != nil {
		t.Fatal(err)
	}
	contains(t, "stop again", f.messages(), "App web in shop-test already stopped (stopped with kip app stop since "+a.Stop.At+")")
	refused(t, "restart a stopped app", app.Restart(ctx, o),
		"cannot restart app web in shop-test: it is stopped (stopped with kip app stop since "+a.Stop.At+"), so no pod of it runs; start it with 'kip app start "+flags+"'")
	if after := f.written(ctx, t, web); after != before {
		t.Errorf("stop again or a refused restart wrote the App:\n%s\n→ %s", before, after)
	}
	// scale while stopped: the count is stored for the start.
	if err := app.Scale(ctx, &app.ScaleOptions{AppOptions: *o, Replicas: 6}); err != nil {
		t.Fatal(err)
	}
	contains(t, "scale a stopped app", f.messages(), "Stored 6 replicas for app web in shop-test (was 5)",
		"The app stays stopped until 'kip app start "+flags+"'; it starts at 6 replicas.")
	f.acted(ctx, t, web)
	if d := f.deployment(ctx, t, web); *d.Spec.Replicas != 0 {
		t.Errorf("a stopped app's Deployment: %d replicas, want 0", *d.Spec.Replicas)
	}

	// start: the stop goes, the app runs its stored count.
	if err := app.Start(ctx, o); err != nil {
		t.Fatal(err)
	}
	if a, d := f.phase(ctx, t, web, app.PhaseRunning), f.deployment(ctx, t, web); a.Stop != nil || *d.Spec.Replicas != 6 || d.Status.ReadyReplicas != 6 {
		t.Fatalf("after start: stop %+v, Deployment %d with %d ready", a.Stop, *d.Spec.Replicas, d.Status.ReadyReplicas)
	}
	contains(t, "start", f.messages(), "Starting app web in shop-test at 6 replicas", "Started app web in shop-test (6 of 6 replicas ready)")
	if err := app.Start(ctx, o); err != nil {
		t.Fatal(err)
	}
	contains(t, "start again", f.messages(), "App web in shop-test already running (6 of 6 replicas ready)")

	// With autoscaling on, a start starts the app at its minimum.
	if err := app.Stop(ctx, o); err != nil {
		t.Fatal(err)
	}
	if err := app.SetAutoscale(ctx, &app.AutoscaleOptions{AppOptions: *o, Min: ptr.To[int32](2), Max: ptr.To[int32](6)}); err != nil {
		t.Fatal(err)
	}
	contains(t, "autoscale a stopped app", f.messages(), "The app stays stopped until 'kip app start "+flags+"'; it starts at its minimum, 2, and the autoscaler moves it within 2 to 6.")
	if err := app.Start(ctx, o); err != nil {
		t.Fatal(err)
	}
	if a, d := f.get(ctx, t, web), f.deployment(ctx, t, web); a.Replicas != 6 || *d.Spec.Replicas != 2 || d.Status.ReadyReplicas != 2 {
		t.Fatalf("start with autoscaling on: stored %d, Deployment %d with %d ready; want the minimum, 2", a.Replicas, *d.Spec.Replicas, d.Status.ReadyReplicas)
	}
}

// TestConcurrentChange: a command writes the App behind a test of what it read, so a change made
// since fails the write and stays, rather than being overwritten: a write whose generation moved
// since, and the removal of a stop that changed since. The stand-in's status updates meanwhile
// fail nothing (every command of TestAppCommands writes while it updates the status).
func TestConcurrentChange(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	f := setup(ctx, t, "app-node-2", "blog", "prod")
	api := service.Ref{Project: "blog", Environment: "prod", Name: "api"}
	f.app(ctx, t, api, map[string]any{"replicas": int64(1)})
	if d := f.deployment(ctx, t, api); d.Spec.Template.Spec.Containers[0].Image != "kip.invalid/app" {
		t.Errorf("an app without an image runs the stand-in's: %s", d.Spec.Template.Spec.Containers[0].Image)
	}
	apps := f.cl.Dynamic.Resource(app.AppsGVR).Namespace(api.Namespace())
	// other writes as another writer would, again when the stand-in's status update came first.
	other := func(field any, path ...string) {
		t.Helper()
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			u, err := apps.Get(ctx, api.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if err := unstructured.SetNestedField(u.Object, field, path...); err != nil {
				return err
			}
			_, err = apps.Update(ctx, u, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}

	stale := f.get(ctx, t, api)
	other(int64(2), "spec", "replicas")
	refused(t, "a write over a change", app.Set(ctx, f.cl, stale, "scale app "+api.String(), "/spec/replicas", 3),
		"scale app api in blog-prod: the app changed since kip read it (generation 1, now 2), so nothing was written; run the command again")
	if a := f.get(ctx, t, api); a.Replicas != 2 {
		t.Errorf("the other writer's count was overwritten: %d, want 2", a.Replicas)
	}

	o := &app.AppOptions{Options: f.opts, Ref: api}
	if err := app.Stop(ctx, o); err != nil {
		t.Fatal(err)
	}
	stale = f.get(ctx, t, api)
	other("stopped by another writer", "spec", "stop", "reason")
	refused(t, "removing a stop that changed", app.RemoveStop(ctx, f.cl, stale),
		"start app api in blog-prod: its stop changed since kip read it (stopped with kip app stop since "+stale.Stop.At+"), so nothing was written")
	if a := f.get(ctx, t, api); a.Stop == nil || a.Stop.Reason != "stopped by another writer" {
		t.Errorf("the other writer's stop was removed or overwritten: %+v", a.Stop)
	}
	// Read afresh, the start removes it.
	if err := app.Start(ctx, o); err != nil {
		t.Fatal(err)
	}
	if a := f.phase(ctx, t, api, app.PhaseRunning); a.Stop != nil {
		t.Errorf("after start: stop %+v", a.Stop)
	}
}

// TestInvalidSettings: an app whose stored autoscaling block the rules refuse (written before
// the rules) cannot be scaled until its block is mended, and kip app autoscale mends it only
// with settings the rules accept.
func TestInvalidSettings(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	f := setup(ctx, t, "app-node-3", "old", "prod")
	ref := service.Ref{Project: "old", Environment: "prod", Name: "legacy"}
	f.app(ctx, t, ref, map[string]any{"replicas": int64(2), "autoscale": map[string]any{"enabled": false, "minReplicas": int64(2)}})
	o := &app.AppOptions{Options: f.opts, Ref: ref}
	flags := "legacy --project old --environment prod"
	before := f.written(ctx, t, ref)
	refused(t, "scale with an invalid block", app.Scale(ctx, &app.ScaleOptions{AppOptions: *o, Replicas: 3}),
		"cannot scale app legacy in old-prod: its autoscaling settings are invalid (its minimum 2 is above 1 without a maximum)",
		"'kip app autoscale "+flags+" --min N --max M --cpu-target P'", "'kip app autoscale "+flags+" --off'")
	refused(t, "autoscale --off keeping the invalid bounds", app.SetAutoscale(ctx, &app.AutoscaleOptions{AppOptions: *o, Off: true}),
		"cannot set the autoscaling of app legacy in old-prod to off, bounds 2 or more: its minimum 2 is above 1 without a maximum")
	if after := f.written(ctx, t, ref); after != before {
		t.Errorf("a refused command wrote the App:\n%s\n→ %s", before, after)
	}
	if err := app.SetAutoscale(ctx, &app.AutoscaleOptions{AppOptions: *o, Off: true, Max: ptr.To[int32](4)}); err != nil {
		t.Fatal(err)
	}
	if a := f.get(ctx, t, ref); a.Autoscale.Invalid() != "" || a.Autoscale.Enabled || a.Autoscale.Bounds().String() != "2 to 4" {
		t.Errorf("after autoscale --off --max 4: %s (%s)", a.Autoscale.Describe(), a.Autoscale.Invalid())
	}
	if err := app.Scale(ctx, &app.ScaleOptions{AppOptions: *o, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	if a, d := f.get(ctx, t, ref), f.deployment(ctx, t, ref); a.Replicas != 3 || *d.Spec.Replicas != 3 {
		t.Errorf("after scale 3: stored %d, Deployment %d", a.Replicas, *d.Spec.Replicas)
	}
}
