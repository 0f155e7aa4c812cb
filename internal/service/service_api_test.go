package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	runtimeconv "k8s.io/apimachinery/pkg/runtime"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/moveguard"
	"kipper.run/kip/internal/service"
	consolestandin "kipper.run/kip/test/console-standin"
	"kipper.run/kip/test/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

type fixture struct {
	e      *testenv.Env
	cl     *kube.Clients
	out    *bytes.Buffer
	errOut *bytes.Buffer
	opts   service.Options
	node   string
}

// setup starts the console stand-in against the test environment, with one kwok node for the
// services' pods, and applies kip's move policies.
func setup(ctx context.Context, t *testing.T, nodeName string) *fixture {
	t.Helper()
	e := testenv.Get(t)
	cl, err := kube.NewClients(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	e.AddNode(t, nodeName, testenv.NodeOptions{Labels: map[string]string{"kip-test": nodeName}})
	var objs []*unstructured.Unstructured
	for _, p := range moveguard.Policies() {
		m, err := runtimeconv.DefaultUnstructuredConverter.ToUnstructured(p)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	if err := kube.Apply(ctx, cl, objs, kube.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	s := &consolestandin.Standin{Kube: e.Kube, Dynamic: cl.Dynamic, Image: "kip.invalid/service", Interval: time.Second,
		CopyHolders: cluster.CopyHolders, Logf: t.Logf}
	go func() { defer close(done); s.Run(sctx) }()
	t.Cleanup(func() { stop(); <-done })
	f := &fixture{e: e, cl: cl, out: &bytes.Buffer{}, errOut: &bytes.Buffer{}, node: nodeName}
	ios := &cli.IOStreams{Out: f.out, ErrOut: f.errOut, Getenv: func(string) string { return "" }}
	f.opts = service.Options{Kube: func() (*kube.Clients, error) { return cl, nil }, Printer: cli.NewPrinter(ios),
		Prompter: cli.NewPrompter(ios, true), Out: f.out}
	return f
}

// project creates a Project with environments and waits until the stand-in made their namespaces.
func (f *fixture) project(ctx context.Context, t *testing.T, name string, envs ...string) {
	t.Helper()
	var list []any
	for _, e := range envs {
		list = append(list, map[string]any{"name": e})
	}
	p := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Project",
		"metadata": map[string]any{"name": name}, "spec": map[string]any{"environments": list}}}
	if _, err := f.cl.Dynamic.Resource(service.ProjectsGVR).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, env := range envs {
		ns := name + "-" + env
		if err := kube.Poll(ctx, time.Minute, "namespace "+ns, func(ctx context.Context) (bool, string, error) {
			_, err := f.e.Kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			return err == nil, "", client(err)
		}); err != nil {
			t.Fatal(err)
		}
	}
}

func client(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// volume creates a PersistentVolume on the fixture's node bound in advance to claim, as a
// provisioner would (the test environment has none).
func (f *fixture) volume(ctx context.Context, t *testing.T, ns, claim string) {
	t.Helper()
	f.volumeNamed(ctx, t, "pv-"+ns+"-"+claim, ns, claim)
}

func (f *fixture) volumeNamed(ctx context.Context, t *testing.T, name, ns, claim string) {
	t.Helper()
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("5Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			ClaimRef:                      &corev1.ObjectReference{Namespace: ns, Name: claim},
			PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{
				Path: "/var/lib/rancher/k3s/storage/" + ns + "_" + claim}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{f.node}}}}}}},
		},
	}
	if _, err := f.e.Kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = f.e.Kube.CoreV1().PersistentVolumes().Delete(context.Background(), pv.Name, metav1.DeleteOptions{})
	})
}

func (f *fixture) service(ctx context.Context, t *testing.T, ref service.Ref, typ string) {
	t.Helper()
	f.volume(ctx, t, ref.Namespace(), "data-"+ref.Name+"-0")
	if typ == "postgres" {
		f.volume(ctx, t, ref.Namespace(), "dump-"+ref.Name+"-0")
	}
	f.serviceObject(ctx, t, ref, map[string]any{"type": typ, "storage": "5Gi",
		"resources": map[string]any{"cpuRequest": "500m", "memoryRequest": "256Mi", "memoryLimit": "512Mi"}})
	if err := service.WaitRunning(ctx, f.cl.Dynamic, f.e.Kube, ref, time.Minute); err != nil {
		t.Fatal(err)
	}
}

// serviceObject writes the Service ref with spec, as the console does.
func (f *fixture) serviceObject(ctx context.Context, t *testing.T, ref service.Ref, spec map[string]any) {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Service",
		"metadata": map[string]any{"name": ref.Name, "namespace": ref.Namespace()}, "spec": spec}}
	if _, err := f.cl.Dynamic.Resource(service.ServicesGVR).Namespace(ref.Namespace()).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestServiceCommandsThroughConsoleAPI drives kip service stop, start, info, update, delete and
// recreate-dump and kip project remove-env and delete against the real API server, with the
// console stand-in turning the Service objects into StatefulSets and kwok running their pods; an
// unfinished move gates each of them.
func TestServiceCommandsThroughConsoleAPI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	f := setup(ctx, t, "svc-node")
	f.project(ctx, t, "shop", "staging", "prod")
	db := service.Ref{Project: "shop", Environment: "staging", Name: "db"}
	f.service(ctx, t, db, "postgres")
	so := &service.ServiceOptions{Options: f.opts, Ref: db}

	// info while running: the node, and where the data is.
	if err := service.ShowInfo(ctx, so); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"State:        Running", "Runs on:      node svc-node (pod db-0, Running, ready)",
		"Data:         data-db-0 (Bound, 5Gi): /var/lib/rancher/k3s/storage/shop-staging_data-db-0 on node svc-node",
		"Data:         dump-db-0 (Bound, 5Gi)", "CPU 500m (limit (unset)), memory 256Mi (limit 512Mi)"} {
		if !strings.Contains(f.out.String(), want) {
			t.Errorf("info lacks %q:\n%s", want, f.out)
		}
	}

	if err := service.Stop(ctx, so); err != nil {
		t.Fatal(err)
	}
	pods, err := service.Pods(ctx, f.e.Kube, &service.Service{Ref: db})
	if err != nil || len(pods) != 0 {
		t.Fatalf("after stop: %d pods, %v", len(pods), err)
	}
	if err := service.Stop(ctx, so); err != nil || !strings.Contains(f.errOut.String(), "already stopped") {
		t.Fatalf("a second stop: %v\n%s", err, f.errOut)
	}
	if err := service.Start(ctx, so); err != nil {
		t.Fatal(err)
	}

	// update: CPU is written, a request above the limit and a shrinking size are refused.
	up := &service.UpdateOptions{ServiceOptions: *so, CPU: "405m"}
	if err := service.Update(ctx, up); err != nil {
		t.Fatal(err)
	}
	s, err := service.Get(ctx, f.cl.Dynamic, db)
	if err != nil || s.Resources.CPURequest != "405m" {
		t.Fatalf("after update: %+v, %v", s, err)
	}
	if err := service.Update(ctx, &service.UpdateOptions{ServiceOptions: *so, Memory: "1Gi"}); err == nil || !strings.Contains(err.Error(), "above the service's memory limit 512Mi") {
		t.Errorf("memory above the limit: %v", err)
	}
	if err := service.Update(ctx, &service.UpdateOptions{ServiceOptions: *so, Storage: "1Gi"}); err == nil || !strings.Contains(err.Error(), "smaller than the declared 5Gi") {
		t.Errorf("a smaller size: %v", err)
	}
	if err := service.WaitRunning(ctx, f.cl.Dynamic, f.e.Kube, db, time.Minute); err != nil {
		t.Fatal(err)
	}

	// An unfinished move gates start, delete, recreate-dump, remove-env and project delete.
	if err := service.SetMove(ctx, f.cl.Dynamic, db, "longhorn"); err != nil {
		t.Fatal(err)
	}
	if err := service.WaitStopped(ctx, f.cl.Dynamic, f.e.Kube, db, time.Minute); err != nil {
		t.Fatalf("console-api must not run a service whose move is unfinished: %v", err)
	}
	finish := "finish it with 'kip service storage longhorn db --project shop --environment staging' or undo it with 'kip service storage longhorn db --project shop --environment staging --rollback'"
	for name, run := range map[string]func() error{
		"start":         func() error { return service.Start(ctx, so) },
		"delete":        func() error { return service.Delete(ctx, so) },
		"recreate-dump": func() error { return service.RecreateDump(ctx, so) },
	} {
		if err := run(); err == nil || !strings.Contains(err.Error(), finish) {
			t.Errorf("%s during a move: %v", name, err)
		}
	}
	po := &service.ProjectOptions{Options: f.opts, Project: "shop", Environment: "staging"}
	if err := service.RemoveEnv(ctx, po); err == nil || !strings.Contains(err.Error(), "cannot remove environment staging of project shop while a move") {
		t.Errorf("remove-env during a move: %v", err)
	}
	if err := service.DeleteProject(ctx, po); err == nil || !strings.Contains(err.Error(), "cannot delete project shop while a move") {
		t.Errorf("project delete during a move: %v", err)
	}
	// A project deleted some other way waits, WaitingForStorageMove, while the namespace policy
	// refuses its namespace's deletion.
	fc := moveguard.Guard{Namespace: db.Namespace(), Service: "db", Claims: []string{"data-db-0"}, Pods: []string{"kip-move-copy-db"}}
	if err := fc.Put(ctx, f.e.Kube); err != nil {
		t.Fatal(err)
	}
	if err := moveguard.CheckEnforced(ctx, f.e.Kube, fc, moveguard.EnforceTimeout); err != nil {
		t.Fatal(err)
	}
	if err := f.cl.Dynamic.Resource(service.ProjectsGVR).Delete(ctx, "shop", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.Poll(ctx, time.Minute, "project shop to wait for the move", func(ctx context.Context) (bool, string, error) {
		p, err := f.cl.Dynamic.Resource(service.ProjectsGVR).Get(ctx, "shop", metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		conds, _, _ := unstructured.NestedSlice(p.Object, "status", "conditions")
		raw, _ := json.Marshal(conds)
		return strings.Contains(string(raw), `"status":"True","type":"WaitingForStorageMove"`), string(raw), nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.e.Kube.CoreV1().Namespaces().Get(ctx, db.Namespace(), metav1.GetOptions{}); err != nil {
		t.Fatalf("the namespace under move must stay: %v", err)
	}
	// The move ends: the deletion goes on.
	if err := moveguard.Lift(ctx, f.e.Kube, db.Namespace(), "db"); err != nil {
		t.Fatal(err)
	}
	if err := service.SetMove(ctx, f.cl.Dynamic, db, ""); err != nil {
		t.Fatal(err)
	}
	if err := kube.Poll(ctx, 2*time.Minute, "namespace shop-staging to go", func(ctx context.Context) (bool, string, error) {
		ns, err := f.e.Kube.CoreV1().Namespaces().Get(ctx, db.Namespace(), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, "", nil
		}
		if err != nil {
			return false, "", err
		}
		return false, "phase " + string(ns.Status.Phase), nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestServiceDeleteRecreateDumpAndRemoveEnv: without a move, recreate-dump gives the service a
// new dump claim and starts it again, delete removes the service with its claims, and remove-env
// has the stand-in delete the environment's namespace.
func TestServiceDeleteRecreateDumpAndRemoveEnv(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	f := setup(ctx, t, "svc-node-2")
	f.project(ctx, t, "blog", "prod", "qa")
	db := service.Ref{Project: "blog", Environment: "prod", Name: "pg"}
	f.service(ctx, t, db, "postgres")
	so := &service.ServiceOptions{Options: f.opts, Ref: db}
	claims := f.e.Kube.CoreV1().PersistentVolumeClaims(db.Namespace())
	before, err := claims.Get(ctx, "dump-pg-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A second volume waits, bound in advance by name, for the claim the StatefulSet recreates.
	f.volumeNamed(ctx, t, "pv-blog-prod-dump-pg-0-new", db.Namespace(), "dump-pg-0")
	if err := service.RecreateDump(ctx, so); err != nil {
		t.Fatal(err)
	}
	after, err := claims.Get(ctx, "dump-pg-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if after.UID == before.UID || after.Spec.VolumeName != "pv-blog-prod-dump-pg-0-new" {
		t.Fatalf("dump claim after recreate-dump: uid %s (was %s), volume %s", after.UID, before.UID, after.Spec.VolumeName)
	}
	if data, err := claims.Get(ctx, "data-pg-0", metav1.GetOptions{}); err != nil || data.Spec.VolumeName != "pv-blog-prod-data-pg-0" {
		t.Fatalf("the data claim must stay: %v %v", data, err)
	}
	if err := service.WaitRunning(ctx, f.cl.Dynamic, f.e.Kube, db, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := service.RecreateDump(ctx, &service.ServiceOptions{Options: f.opts, Ref: service.Ref{Project: "blog", Environment: "prod", Name: "nope"}}); err == nil ||
		!strings.Contains(err.Error(), "no service nope in blog-prod (project blog, environment prod; services there: pg)") {
		t.Errorf("an unknown service: %v", err)
	}

	if err := service.Delete(ctx, so); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"data-pg-0", "dump-pg-0"} {
		if _, err := claims.Get(ctx, c, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			if err == nil {
				// pvc-protection holds a claim until no pod uses it; the pod is gone, so only
				// the finalizer's removal is pending.
				err = kube.Poll(ctx, time.Minute, "claim "+c+" to go", func(ctx context.Context) (bool, string, error) {
					_, err := claims.Get(ctx, c, metav1.GetOptions{})
					return apierrors.IsNotFound(err), "", client(err)
				})
			}
			if err != nil {
				t.Errorf("claim %s after delete: %v", c, err)
			}
		}
	}
	if _, err := f.e.Kube.AppsV1().StatefulSets(db.Namespace()).Get(ctx, "pg", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("StatefulSet after delete: %v", err)
	}

	po := &service.ProjectOptions{Options: f.opts, Project: "blog", Environment: "qa"}
	if err := service.RemoveEnv(ctx, po); err != nil {
		t.Fatal(err)
	}
	if err := kube.Poll(ctx, 2*time.Minute, "namespace blog-qa to go", func(ctx context.Context) (bool, string, error) {
		_, err := f.e.Kube.CoreV1().Namespaces().Get(ctx, "blog-qa", metav1.GetOptions{})
		return apierrors.IsNotFound(err), "", client(err)
	}); err != nil {
		t.Fatal(err)
	}
	p, err := service.Project(ctx, f.cl.Dynamic, "blog")
	if err != nil || strings.Join(service.Environments(p), ",") != "prod" {
		t.Fatalf("project after remove-env: %v, %v", p, err)
	}
	if err := service.RemoveEnv(ctx, po); err == nil || !strings.Contains(err.Error(), `project blog has no environment "qa" (environments: prod)`) {
		t.Errorf("removing it again: %v", err)
	}
}

// TestFindByNameAlone: a service named alone (kip service storage longhorn NAME, as the spec
// writes it) is found when one environment has it; several are refused naming how to pick each,
// and a name no environment has names the projects looked in.
func TestFindByNameAlone(t *testing.T) {
	ctx := t.Context()
	f := setup(ctx, t, "find-node")
	f.project(ctx, t, "findone", "prod", "staging")
	f.project(ctx, t, "findtwo", "prod")
	for _, ns := range []string{"findone-prod", "findone-staging", "findtwo-prod"} {
		name := "cache"
		if ns == "findone-staging" {
			name = "only"
		}
		svc := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Service",
			"metadata": map[string]any{"name": name, "namespace": ns}, "spec": map[string]any{"type": "redis", "storage": "1Gi"}}}
		if _, err := f.cl.Dynamic.Resource(service.ServicesGVR).Namespace(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := service.Find(ctx, f.cl.Dynamic, service.Ref{Name: "only"}); err != nil || got != (service.Ref{Project: "findone", Environment: "staging", Name: "only"}) {
		t.Errorf("Find(only) = %+v, %v", got, err)
	}
	_, err := service.Find(ctx, f.cl.Dynamic, service.Ref{Name: "cache"})
	if err == nil || !strings.Contains(err.Error(), "services named cache are in 2 environments: name one with --project and --environment (cache --project findone --environment prod; cache --project findtwo --environment prod)") {
		t.Errorf("Find(cache) = %v", err)
	}
	if got, err := service.Find(ctx, f.cl.Dynamic, service.Ref{Name: "cache", Project: "findtwo"}); err != nil || got.Environment != "prod" {
		t.Errorf("Find(cache --project findtwo) = %+v, %v", got, err)
	}
	if _, err := service.Find(ctx, f.cl.Dynamic, service.Ref{Name: "nosuch"}); err == nil || !strings.Contains(err.Error(), "no service nosuch in any environment of the projects") {
		t.Errorf("Find(nosuch) = %v", err)
	}
}
