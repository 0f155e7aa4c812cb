package upgrade

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage"
	"helm.sh/helm/v3/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"kipper.run/kip/internal/app"
	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/credential"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/workflow"
	"kipper.run/kip/manifests"
	"kipper.run/kip/test/testenv"
)

const (
	installedBy  = "v0.23.0" // the kip that installed the test's cluster
	upgradeKip   = "v0.24.0" // the kip that upgrades it
	holdFinalize = "kipper.run/test-hold"
)

// installed is a cluster kip installed as far as the API tier can hold one: the Kipper CRDs
// marked by an older kip, kipper-base (with the initial admin binding) and the console, whose
// Deployments run on a kwok node; the cluster record of a nano cluster on local storage.
func installed(ctx context.Context, t *testing.T, node string) (*testenv.Env, *kube.Clients) {
	t.Helper()
	env := testenv.Get(t)
	cl, err := kube.NewClients(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	env.AddNode(t, node, testenv.NodeOptions{})
	rec := cluster.Record{Profile: "nano", Storage: cluster.StorageLocal, Backups: cluster.BackupsNone, Server: "192.0.2.20",
		KipVersion: installedBy, AdminEmail: "admin@example.com"}
	if _, err := cluster.UpdateRecord(ctx, cl.Dynamic, func(r *cluster.Record, _ bool) error { *r = rec; return nil }); err != nil {
		t.Fatal(err)
	}
	pinned, err := manifests.Pinned()
	if err != nil {
		t.Fatal(err)
	}
	o, err := components.Recorded(rec, pinned, installedBy)
	if err != nil {
		t.Fatal(err)
	}
	all, err := components.Render(o)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range all {
		switch c.Name {
		case "kipper-crds", "kipper-base", "console":
			if err := kube.Apply(ctx, cl, c.Objects, kube.ApplyOptions{Force: true}); err != nil {
				t.Fatal(err)
			}
			for _, obj := range c.CreateOnly {
				ri, obj, err := kube.ResourceFor(ctx, cl, obj)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := ri.Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
					t.Fatal(err)
				}
			}
		}
	}
	for _, name := range []string{"console-api", "console"} {
		if err := kube.WaitServingAlone(ctx, cl, consoleNamespace, name, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	return env, cl
}

// quietOptions are a kip upgrade run off a terminal, its report in out.
func quietOptions(cl *kube.Clients, out *bytes.Buffer) *Options {
	ios := &cli.IOStreams{In: strings.NewReader(""), Out: out, ErrOut: out, Getenv: func(string) string { return "" }}
	return &Options{Kube: func() (*kube.Clients, error) { return cl, nil }, Printer: cli.NewPrinter(ios), Prompter: cli.NewPrompter(ios, false),
		Out: out, Holder: "kip upgrade (test)", KipVersion: upgradeKip}
}

// TestUpgradeConsoleLayer upgrades an installed cluster with --skip-system --repair-autoscaling
// against a real API server, kube-controller-manager, scheduler and kwok's pods:
//   - an app that needs a decision stops it first with nothing changed (exit 3), as --check
//     reports;
//   - then the CRDs move (the marker names the new kip), console-api is restarted with its pod
//     hardening and keeps the volume an operator added by hand, the console is restarted, each
//     waited for until its new pods serve alone; the initial admin binding an operator deleted
//     stays deleted;
//   - the autoscaling fix is written late: while an old console-api pod remains (held by a
//     finalizer, as a slow shutdown holds it), the fix is not written, and it is once the pod
//     goes;
//   - the progress record is finished.
func TestUpgradeConsoleLayer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, cl := installed(ctx, t, "upgrade-node")

	operatorEdits(ctx, t, cl)

	ns := projectNamespace(t, cl, "upg", "prod")
	bounds := map[string]any{"enabled": true, "minReplicas": int64(2), "maxReplicas": int64(5), "cpuTarget": int64(70)}
	addApp(t, cl, ns, "api", map[string]any{"replicas": int64(1), "autoscale": bounds}, 3)
	off := map[string]any{"enabled": false, "minReplicas": int64(2), "maxReplicas": int64(5)}
	addApp(t, cl, ns, "worker", map[string]any{"replicas": int64(3), "autoscale": off}, 4)

	// The decision stops the upgrade, and --check says so: nothing changes.
	var out bytes.Buffer
	o := quietOptions(cl, &out)
	o.Check = true
	err := Run(ctx, o)
	var decision *cli.DecisionError
	if !errors.As(err, &decision) || cli.ExitCode(err) != cli.ExitDecision || !strings.Contains(err.Error(), "1 app needs a decision") {
		t.Fatalf("--check with an app that needs a decision: %v (exit %d)\n%s", err, cli.ExitCode(err), out.String())
	}
	for _, want := range []string{"Checking this cluster's data against the rules of kip v0.24.0...",
		"upg-prod/api: autoscaling is on and it stores replicas 1, outside its bounds of 2 to 5",
		"upg-prod/worker: autoscaling is off, but its Deployment is set to 4 while it stores 3"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--check printed no %q:\n%s", want, out.String())
		}
	}
	before := template(ctx, t, cl, "console-api")
	out.Reset()
	o = quietOptions(cl, &out)
	o.SkipSystem, o.RepairAutoscaling = true, true
	if err := Run(ctx, o); !errors.As(err, &decision) || !strings.Contains(err.Error(), "Nothing was changed") || !strings.Contains(err.Error(), "--skip-autoscaling-check") {
		t.Fatalf("an upgrade with an app that needs a decision: %v\n%s", err, out.String())
	}
	if after := template(ctx, t, cl, "console-api"); after.Annotations[upgradedAtAnnotation] != before.Annotations[upgradedAtAnnotation] {
		t.Fatal("an upgrade refused for a decision restarted console-api")
	}

	// The operator decides: the worker at 4.
	patchApp(ctx, t, cl, ns, "worker", `{"spec":{"replicas":4}}`)

	// An old console-api pod that takes its time to go.
	old := holdConsoleAPIPod(ctx, t, cl)

	out.Reset()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, o) }()
	// The new pod runs while the old one terminates: the upgrade waits, and writes no fix.
	if err := kube.Poll(ctx, 2*time.Minute, "console-api's new pod running beside the old one", func(ctx context.Context) (bool, string, error) {
		pods := podsOf(ctx, t, cl, "console-api")
		var oldGoing, newReady bool
		for _, p := range pods {
			if p.Name == old {
				oldGoing = p.DeletionTimestamp != nil
			} else if p.Status.Phase == corev1.PodRunning && ready(&p) {
				newReady = true
			}
		}
		return oldGoing && newReady, "", nil
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Fatalf("the upgrade ended while an old console-api pod remained: %v\n%s", err, out.String())
	default:
	}
	if n := storedReplicas(ctx, t, cl, ns, "api"); n != 1 {
		t.Fatalf("the fix was written (replicas %d) while an old console-api pod remained", n)
	}
	releasePod(t, cl, old)
	if err := <-done; err != nil {
		t.Fatalf("upgrade: %v\n%s", err, out.String())
	}
	t.Logf("kip upgrade --skip-system --repair-autoscaling:\n%s", out.String())

	checkUpgraded(ctx, t, cl, ns)
	for _, want := range []string{"Restart console-api on ghcr.io/getkipper/kipper-console-api:latest", "Fixed upg-prod/api"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the upgrade printed no %q", want)
		}
	}
}

func template(ctx context.Context, t *testing.T, cl *kube.Clients, name string) corev1.PodTemplateSpec {
	t.Helper()
	d, err := cl.Kube.AppsV1().Deployments(consoleNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return d.Spec.Template
}

func podsOf(ctx context.Context, t *testing.T, cl *kube.Clients, app string) []corev1.Pod {
	t.Helper()
	pods, err := cl.Kube.CoreV1().Pods(consoleNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// releasePod lets a held pod go.
func releasePod(t *testing.T, cl *kube.Clients, name string) {
	t.Helper()
	_, err := cl.Kube.CoreV1().Pods(consoleNamespace).Patch(context.Background(), name, types.JSONPatchType,
		[]byte(`[{"op":"remove","path":"/metadata/finalizers"}]`), metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsInvalid(err) {
		t.Errorf("release pod %s: %v", name, err)
	}
}

func patchApp(ctx context.Context, t *testing.T, cl *kube.Clients, ns, name, patch string) {
	t.Helper()
	if _, err := cl.Dynamic.Resource(app.AppsGVR).Namespace(ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

func storedReplicas(ctx context.Context, t *testing.T, cl *kube.Clients, ns, name string) int64 {
	t.Helper()
	u, err := cl.Dynamic.Resource(app.AppsGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n, _, _ := unstructured.NestedInt64(u.Object, "spec", "replicas")
	return n
}

// operatorEdits are what an operator did since the install: a volume added to console-api by
// hand, the read-only root filesystem of an install from before the hardening, the initial
// admin binding deleted (admins are managed in the console).
func operatorEdits(ctx context.Context, t *testing.T, cl *kube.Clients) {
	t.Helper()
	deployments := cl.Kube.AppsV1().Deployments(consoleNamespace)
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d, err := deployments.Get(ctx, "console-api", metav1.GetOptions{})
		if err != nil {
			return err
		}
		c := &d.Spec.Template.Spec.Containers[0]
		if !slices.ContainsFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "extra" }) { // an earlier test's
			d.Spec.Template.Spec.Volumes = append(d.Spec.Template.Spec.Volumes, corev1.Volume{Name: "extra", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "extra", MountPath: "/extra"})
		}
		c.SecurityContext.ReadOnlyRootFilesystem = nil
		_, err = deployments.Update(ctx, d, metav1.UpdateOptions{FieldManager: "kubectl-edit"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := cl.Kube.RbacV1().ClusterRoleBindings().Delete(ctx, "kipper-admins", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.WaitServingAlone(ctx, cl, consoleNamespace, "console-api", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
}

// holdConsoleAPIPod holds console-api's one pod with a finalizer, as a slow shutdown would hold
// it once a rollout replaces it, until the test releases it (releasePod) or ends; it returns the
// pod's name.
func holdConsoleAPIPod(ctx context.Context, t *testing.T, cl *kube.Clients) string {
	t.Helper()
	pods := podsOf(ctx, t, cl, "console-api")
	if len(pods) != 1 {
		t.Fatalf("console-api runs %d pods, want 1", len(pods))
	}
	name := pods[0].Name
	if _, err := cl.Kube.CoreV1().Pods(consoleNamespace).Patch(ctx, name, types.MergePatchType,
		[]byte(`{"metadata":{"finalizers":["`+holdFinalize+`"]}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { releasePod(t, cl, name) })
	return name
}

// checkUpgraded checks the end state of an upgrade with --skip-system --repair-autoscaling of
// the installed cluster with operatorEdits, whose app ns/api's stored count was to become 3.
func checkUpgraded(ctx context.Context, t *testing.T, cl *kube.Clients, ns string) {
	t.Helper()
	if n := storedReplicas(ctx, t, cl, ns, "api"); n != 3 {
		t.Errorf("the approved fix stored replicas %d, want the Deployment's 3", n)
	}
	crd, err := cl.APIExt.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, components.AppCRD, metav1.GetOptions{})
	if err != nil || crd.Annotations[components.KipVersionAnnotation] != upgradeKip {
		t.Errorf("the App CRD's marker after the upgrade: %v (%v)", crd.Annotations[components.KipVersionAnnotation], err)
	}
	api := template(ctx, t, cl, "console-api")
	if api.Annotations[upgradedAtAnnotation] == "" {
		t.Error("console-api's pod template carries no restart mark")
	}
	c := api.Spec.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || api.Spec.SecurityContext == nil || api.Spec.SecurityContext.RunAsNonRoot == nil {
		t.Errorf("console-api's hardening after the upgrade: pod %+v, container %+v", api.Spec.SecurityContext, sc)
	}
	var volumes, mounts []string
	for _, v := range api.Spec.Volumes {
		volumes = append(volumes, v.Name)
	}
	for _, m := range c.VolumeMounts {
		mounts = append(mounts, m.MountPath)
	}
	if !slices.Contains(volumes, "extra") || !slices.Contains(volumes, "tmp") || !slices.Contains(mounts, "/extra") || !slices.Contains(mounts, "/tmp") {
		t.Errorf("console-api's volumes %v and mounts %v: want the hand-added extra at /extra kept beside tmp", volumes, mounts)
	}
	if ui := template(ctx, t, cl, "console"); ui.Annotations[upgradedAtAnnotation] != api.Annotations[upgradedAtAnnotation] {
		t.Errorf("the console's restart mark %q, console-api's %q", ui.Annotations[upgradedAtAnnotation], api.Annotations[upgradedAtAnnotation])
	}
	for _, name := range []string{"console-api", "console"} {
		if alone, pending, err := kube.ServingAlone(ctx, cl, consoleNamespace, name); !alone {
			t.Errorf("%s after the upgrade: %s %v", name, pending, err)
		}
	}
	if _, err := cl.Kube.RbacV1().ClusterRoleBindings().Get(ctx, "kipper-admins", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the initial admin binding an operator deleted: %v, want it left deleted", err)
	}
	if _, err := cl.Kube.RbacV1().ClusterRoles().Get(ctx, "kipper-console-api", metav1.GetOptions{}); err != nil {
		t.Errorf("console-api's ClusterRole: %v", err)
	}
	if p, err := workflow.Unfinished(ctx, cl.Dynamic, kube.ClusterRecords(), Workflow, nil); err != nil || p != nil {
		t.Errorf("the upgrade's progress record: %+v, %v; want it finished", p, err)
	}
}

// TestCheckRequestsAndFailedRelease runs kip upgrade --check on a Longhorn cluster with backups
// in MinIO, monitoring on and a *.kipper.run name, whose Traefik release failed (written with
// Helm's own storage driver, as helm-controller's Job leaves it): the check names the release
// with the recovery to run on the server and exits 3, in at most 20 API requests (each kind of
// object is listed once, whatever the cluster's size: TestAutoscalingCheck and the route test
// prove it for the apps and the routes); the upgrade refuses before anything changes, and
// --skip-system, which leaves the charts alone, does not read them.
func TestCheckRequestsAndFailedRelease(t *testing.T) {
	env := testenv.Get(t)
	cl, n := testenv.CountingClients(t, env.Config)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env.ReadyNode(t, "requests-server", map[string]string{"node-role.kubernetes.io/control-plane": "true"})
	rec := cluster.Record{Profile: "small", Storage: cluster.StorageLonghorn, Backups: cluster.BackupsInCluster, Server: "shop.kipper.run",
		KipVersion: installedBy, Monitoring: cluster.Monitoring{Prometheus: true, Loki: true}}
	if _, err := cluster.UpdateRecord(ctx, cl.Dynamic, func(r *cluster.Record, _ bool) error { *r = rec; return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "traefik"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	secrets := cl.Kube.CoreV1().Secrets("traefik")
	store := storage.Init(driver.NewSecrets(secrets))
	for rev, status := range []release.Status{release.StatusDeployed, release.StatusFailed} {
		rel := &release.Release{Name: "traefik", Namespace: "traefik", Version: rev + 1,
			Chart: &chart.Chart{Metadata: &chart.Metadata{APIVersion: "v2", Name: "traefik", Version: "41.6.0"}},
			Info:  &release.Info{Status: status, Description: "Upgrade \"traefik\" failed: timed out waiting for the condition"}}
		if err := store.Create(rel); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		secrets.DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "owner=helm,name=traefik"})
	})

	var out bytes.Buffer
	o := quietOptions(cl, &out)
	o.Check = true
	n.Take()
	err := Run(ctx, o)
	requests, what := n.Take()
	t.Logf("kip upgrade --check: %d API requests:\n%s", requests, strings.Join(what, "\n"))
	if requests > 20 {
		t.Errorf("kip upgrade --check made %d API requests, want at most 20", requests)
	}
	if cli.ExitCode(err) != cli.ExitDecision || !strings.Contains(fmt.Sprint(err), "1 system component's Helm release failed") {
		t.Errorf("--check with a failed release: %v (exit %d)", err, cli.ExitCode(err))
	}
	for _, want := range []string{"✗   The Helm release of traefik (traefik) failed, and helm-controller would hang resetting it. Recover it first, on the server:",
		"ssh root@shop.kipper.run", "kubectl -n traefik delete secret -l owner=helm,name=traefik",
		`kubectl -n kube-system annotate helmchart traefik kip.kipper/reapply="$(date +%s)" --overwrite`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--check printed no %q:\n%s", want, out.String())
		}
	}

	out.Reset()
	ios := &cli.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &out, Getenv: func(string) string { return "" }}
	o = quietOptions(cl, &out)
	o.Prompter = cli.NewPrompter(ios, true)
	if err := Run(ctx, o); err == nil || !strings.Contains(err.Error(), "Nothing was changed: recover it as shown, then run kip upgrade again, or run kip upgrade --skip-system") {
		t.Errorf("kip upgrade --yes with a failed release: %v", err)
	}
	if p, err := workflow.Unfinished(ctx, cl.Dynamic, kube.ClusterRecords(), Workflow, nil); err != nil || p != nil {
		t.Errorf("an upgrade refused before it started left a progress record: %+v %v", p, err)
	}
	out.Reset()
	o = quietOptions(cl, &out)
	o.Check, o.SkipSystem = true, true
	if err := Run(ctx, o); err != nil || strings.Contains(out.String(), "Helm release") {
		t.Errorf("--check --skip-system with a failed release it does not touch: %v\n%s", err, out.String())
	}
}

// TestFixesDeferredWhileConsoleAPIIsNotAlone runs the fixes step when console-api does not serve
// alone as it starts (a rollout begun after the console step's wait, its old pod still
// terminating): it writes no fix, says why and that the next kip upgrade applies them, and counts
// as done, so that the upgrade finishes; the check still offers the fix. Run again once
// console-api serves alone, it writes the fix.
func TestFixesDeferredWhileConsoleAPIIsNotAlone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, cl := installed(ctx, t, "deferred-node")
	ns := projectNamespace(t, cl, "deferred", "prod")
	bounds := map[string]any{"enabled": true, "minReplicas": int64(2), "maxReplicas": int64(5), "cpuTarget": int64(70)}
	addApp(t, cl, ns, "api", map[string]any{"replicas": int64(1), "autoscale": bounds}, 3)
	apps, outside, err := ReadApps(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	var approved []*Finding
	for _, f := range CheckApps(apps, outside, upgradeKip).Repairs {
		if f.App.Namespace() == ns {
			approved = append(approved, f)
		}
	}
	if len(approved) != 1 {
		t.Fatalf("%d repairs in %s, want 1", len(approved), ns)
	}

	// A new console-api rollout whose old pod takes its time to go.
	old := holdConsoleAPIPod(ctx, t, cl)
	if _, err := cl.Kube.AppsV1().Deployments(consoleNamespace).Patch(ctx, "console-api", types.MergePatchType,
		[]byte(`{"spec":{"template":{"metadata":{"annotations":{"kipper.run/test-rollout":"deferred"}}}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// The state the step meets: the rollout done as the Deployment's status says (its controller
	// writes that after it deleted the old pod, a moment later), the old pod still terminating.
	if err := kube.Poll(ctx, 2*time.Minute, "console-api rolled out, its old pod terminating", func(ctx context.Context) (bool, string, error) {
		p, err := cl.Kube.CoreV1().Pods(consoleNamespace).Get(ctx, old, metav1.GetOptions{})
		if err != nil || p.DeletionTimestamp == nil {
			return false, "the old pod is not terminating", err
		}
		d, err := cl.Kube.AppsV1().Deployments(consoleNamespace).Get(ctx, "console-api", metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		done, pending, err := kube.RolloutStatus(d)
		return done, pending, err
	}); err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	o := quietOptions(cl, &out)
	u := &upgrader{o: o, p: o.Printer, cl: cl}
	step := u.fixesStep(approved)
	if done, err := step.Check(ctx); err != nil || done {
		t.Fatalf("the fixes step's check before it ran: done %v, %v", done, err)
	}
	if err := step.Apply(ctx); err != nil {
		t.Fatalf("the fixes step while console-api does not serve alone: %v", err)
	}
	if n := storedReplicas(ctx, t, cl, ns, "api"); n != 1 {
		t.Fatalf("the fix was written (replicas %d) while console-api did not serve alone", n)
	}
	for _, want := range []string{"Wrote no autoscaling fix: kip cannot confirm that the new console-api serves alone (", old, "Run kip upgrade again to apply them"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the deferred step printed no %q:\n%s", want, out.String())
		}
	}
	if done, err := step.Check(ctx); err != nil || !done {
		t.Fatalf("the deferred fixes step does not count as done (%v, %v): the upgrade would not finish", done, err)
	}
	apps, outside, err = ReadApps(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	offered := false
	for _, f := range CheckApps(apps, outside, upgradeKip).Repairs {
		offered = offered || f.App.Namespace() == ns
	}
	if !offered {
		t.Error("after the deferral the check no longer offers the fix")
	}

	releasePod(t, cl, old)
	if err := kube.WaitServingAlone(ctx, cl, consoleNamespace, "console-api", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	again := u.fixesStep(approved)
	if err := again.Apply(ctx); err != nil {
		t.Fatalf("the fixes step once console-api serves alone: %v\n%s", err, out.String())
	}
	if n := storedReplicas(ctx, t, cl, ns, "api"); n != 3 {
		t.Errorf("once console-api serves alone the fix wrote replicas %d, want the Deployment's 3\n%s", n, out.String())
	}
}

// TestUpgradeSeedsCredentialGrants: a shared git credential whose allow-list was never set, used
// by an app, is listed by --check with the project it would be granted; off a terminal without
// --seed-credential-grants the upgrade leaves it unset and says how to set it; with the flag it
// writes the project's name and nothing else of the Secret.
func TestUpgradeSeedsCredentialGrants(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, cl := installed(ctx, t, "seed-node")
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "seed-git", Namespace: credential.Namespace,
		Labels: map[string]string{credential.Label: "true"}}, StringData: map[string]string{"token": "not-printed"}}
	if _, err := cl.Kube.CoreV1().Secrets(credential.Namespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cl.Kube.CoreV1().Secrets(credential.Namespace).Delete(context.Background(), "seed-git", metav1.DeleteOptions{})
	})
	ns := projectNamespace(t, cl, "seeded", "prod")
	addApp(t, cl, ns, "web", map[string]any{"replicas": int64(1), "git": map[string]any{"credential": "seed-git"}}, 1)
	allowed := func() (string, bool) {
		s, err := cl.Kube.CoreV1().Secrets(credential.Namespace).Get(ctx, "seed-git", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v, ok := s.Annotations[credential.AllowedAnnotation]
		return v, ok
	}

	var out bytes.Buffer
	o := quietOptions(cl, &out)
	o.Check = true
	if err := Run(ctx, o); err != nil && !strings.Contains(err.Error(), "decision") {
		t.Fatalf("--check: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "seed-git: seeded") {
		t.Errorf("--check does not list the grant:\n%s", out.String())
	}

	out.Reset()
	o = quietOptions(cl, &out)
	o.SkipSystem, o.SkipAutoscalingCheck, o.RepairAutoscaling = true, true, true
	if err := Run(ctx, o); err != nil {
		t.Fatalf("upgrade off a terminal: %v\n%s", err, out.String())
	}
	if v, set := allowed(); set {
		t.Errorf("off a terminal without --seed-credential-grants the allow-list was set to %q", v)
	}
	if !strings.Contains(out.String(), "kip upgrade --seed-credential-grants, or kip credentials allow, sets them later") {
		t.Errorf("the upgrade does not say how to seed later:\n%s", out.String())
	}

	out.Reset()
	o = quietOptions(cl, &out)
	o.SkipSystem, o.SkipAutoscalingCheck, o.RepairAutoscaling, o.SeedCredentialGrants = true, true, true, true
	if err := Run(ctx, o); err != nil {
		t.Fatalf("upgrade --seed-credential-grants: %v\n%s", err, out.String())
	}
	if v, set := allowed(); !set || v != "seeded" {
		t.Errorf("after --seed-credential-grants the allow-list is %q (set %v), want \"seeded\"", v, set)
	}
	if strings.Contains(out.String(), "not-printed") {
		t.Error("the upgrade printed the credential's data")
	}
}
