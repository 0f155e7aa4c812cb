package components

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/test/testenv"
)

// asHelper, set by chartchange_api_test.go (built with -tags kipfault), runs the binary as the
// helper process of TestChartChangeKilledAfterItsWrite when its environment asks for that, and
// then never returns.
var asHelper = func() {}

// TestMain shares one API test environment among this package's tests (started on first use by
// testenv.Get, stopped when the tests end). Run as a helper process, the binary applies a
// component to the parent's environment instead, and never starts one.
func TestMain(m *testing.M) {
	asHelper()
	os.Exit(testenv.Main(m))
}

func apiTestClients(t *testing.T) (*testenv.Env, *kube.Clients) {
	t.Helper()
	env := testenv.Get(t)
	cl, err := kube.NewClients(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return env, cl
}

// TestComponentsAcceptedByAPIServer applies every object of every component of the larger sets
// (Longhorn, in-cluster and external backups, monitoring) to a real API server with Longhorn's,
// Velero's, helm-controller's and Kipper's CRDs, as install would: Objects, then CreateOnly, then
// After.
func TestComponentsAcceptedByAPIServer(t *testing.T) {
	_, cl := apiTestClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// What the charts would have made by the time After is applied: Longhorn's manager creates its
	// class, and cert-manager's chart brings its CRDs (not in kip's module graph, so a stand-in
	// that accepts any ClusterIssuer).
	_, err := cl.Kube.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: "longhorn"},
		Provisioner: "driver.longhorn.io",
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	standIn := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "clusterissuers.cert-manager.io"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "cert-manager.io",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: "ClusterIssuer", ListKind: "ClusterIssuerList", Plural: "clusterissuers", Singular: "clusterissuer"},
			Scope: apiextensionsv1.ClusterScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object", XPreserveUnknownFields: ptr.To(true)}}}},
		},
	}
	if _, err := cl.APIExt.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, standIn, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := kube.WaitCRDsEstablished(ctx, cl, []string{standIn.Name}, time.Minute); err != nil {
		t.Fatal(err)
	}

	o := testOptions(t, "large", cluster.StorageLonghorn)
	sets := [][]Component{renderComponents(t, o)}
	o.Backups = &BackupStorage{Bucket: "backups", Endpoint: "https://s3.example.com", AccessKeyID: "id", SecretAccessKey: "key"}
	sets = append(sets, renderComponents(t, o))
	for _, comps := range sets {
		for _, c := range comps {
			for _, part := range []struct {
				what string
				objs []*unstructured.Unstructured
			}{{"objects", c.Objects}, {"create-only objects", c.CreateOnly}, {"after objects", c.After}} {
				if err := kube.Apply(ctx, cl, part.objs, kube.ApplyOptions{}); err != nil {
					t.Fatalf("%s: apply its %s: %v", c.Name, part.what, err)
				}
			}
		}
	}

	// What was stored is what kip rendered.
	lh := componentNamed(t, sets[0], "longhorn")
	for _, s := range lh.After {
		if s.GetKind() != "Setting" {
			continue
		}
		got, err := cl.Longhorn.LonghornV1beta2().Settings("longhorn-system").Get(ctx, s.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if want, _, _ := unstructured.NestedString(s.Object, "value"); got.Value != want {
			t.Errorf("setting %s stored %q, want %q", s.GetName(), got.Value, want)
		}
	}
	class, err := cl.Kube.StorageV1().StorageClasses().Get(ctx, "longhorn", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if class.Annotations["storageclass.kubernetes.io/is-default-class"] != "false" || class.Provisioner != "driver.longhorn.io" {
		t.Errorf("longhorn class %v %s", class.Annotations, class.Provisioner)
	}
	ready, pending, err := lh.Status(ctx, cl)
	if err != nil || ready || pending != "HelmChart kube-system/longhorn: Job helm-install-longhorn not created yet (k3s's helm-controller creates it)" {
		t.Errorf("longhorn without its Job: ready %v, pending %q, err %v", ready, pending, err)
	}

	// kip's own CRDs are established once applied.
	crds := componentNamed(t, sets[0], "kipper-crds")
	if ready, pending, err := crds.Status(ctx, cl); err != nil || !ready {
		t.Errorf("kipper-crds: ready %v, pending %q, err %v", ready, pending, err)
	}

	// An After object changed by hand is pending again, naming the field and not its value.
	s, err := cl.Longhorn.LonghornV1beta2().Settings("longhorn-system").Get(ctx, "upgrade-checker", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Value = "true"
	if _, err := cl.Longhorn.LonghornV1beta2().Settings("longhorn-system").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, pending, err = lh.Status(ctx, cl)
	if err != nil || !strings.Contains(pending, "Setting longhorn-system/upgrade-checker differs from what kip applies at .value") {
		t.Errorf("pending %q, err %v", pending, err)
	}
}

// TestComponentStatus follows a chart component and kip's own console from nothing to ready: the
// helm-install Job helm-controller would run, its version, its failure, the chart's workloads.
func TestComponentStatus(t *testing.T) {
	env, cl := apiTestClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	node := env.AddNode(t, "components-node", testenv.NodeOptions{})

	comps := renderComponents(t, testOptions(t, "nano", cluster.StorageLocal))
	keda := componentNamed(t, comps, "keda")
	ready, pending, err := keda.Status(ctx, cl)
	if err != nil || ready || !strings.Contains(pending, "Job helm-install-keda not created yet") {
		t.Fatalf("keda before install: ready %v, pending %q, err %v", ready, pending, err)
	}
	if err := kube.Apply(ctx, cl, keda.Objects, kube.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	want, _, _ := unstructured.NestedString(findObject(t, keda.Objects, "HelmChart", "kube-system", "keda").Object, "spec", "version")

	// helm-controller's Job for an older version of the chart.
	job := fakeHelmInstallJob("keda", "2.0.0", node.Name)
	createHelmJob(ctx, t, cl, job)
	_, pending, err = keda.Status(ctx, cl)
	if err != nil || !strings.Contains(pending, `Job helm-install-keda installs version "2.0.0", not `+want+" yet") {
		t.Fatalf("keda with an old Job: pending %q, err %v", pending, err)
	}
	deleteHelmJob(ctx, t, cl, job.Name)

	// The Job for this version, and a workload of the chart still rolling out.
	deployment := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "keda-operator", Namespace: "keda",
			Annotations: map[string]string{"meta.helm.sh/release-name": "keda"}},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "keda-operator"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "keda-operator"}, Annotations: testenv.FastPodAnnotations()},
				Spec:       corev1.PodSpec{NodeName: node.Name, Containers: []corev1.Container{{Name: "keda", Image: "keda"}}},
			},
		},
	}
	// Another release's workload in the same namespace never rolls out, and does not count.
	other := deployment.DeepCopy()
	other.Name, other.Annotations["meta.helm.sh/release-name"] = "other-release", "other"
	other.Spec.Selector.MatchLabels["app"], other.Spec.Template.Labels["app"] = "other", "other"
	other.Spec.Template.Spec.NodeName = ""
	other.Spec.Template.Spec.NodeSelector = map[string]string{"nowhere": "true"}
	for _, d := range []*appsv1.Deployment{deployment, other} {
		if _, err := cl.Kube.AppsV1().Deployments("keda").Create(ctx, d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	createHelmJob(ctx, t, cl, fakeHelmInstallJob("keda", want, node.Name))
	waitComponentReady(ctx, t, cl, keda)

	// A Job that failed is not ready, and pending says why.
	zot := componentNamed(t, comps, "zot")
	if err := kube.Apply(ctx, cl, zot.Objects, kube.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	zotVersion, _, _ := unstructured.NestedString(findObject(t, zot.Objects, "HelmChart", "kube-system", "zot").Object, "spec", "version")
	failing := fakeHelmInstallJob("zot", zotVersion, "")
	failing.Spec.ActiveDeadlineSeconds = ptr.To[int64](1)
	failing.Spec.Template.Spec.NodeSelector = map[string]string{"nowhere": "true"}
	createHelmJob(ctx, t, cl, failing)
	for {
		ready, pending, err = zot.Status(ctx, cl)
		if err != nil || ready || strings.Contains(pending, "failed installing") {
			break
		}
		pause(ctx, t)
	}
	if err != nil || ready || !strings.Contains(pending, "Job helm-install-zot failed installing "+zotVersion+" (DeadlineExceeded") ||
		!strings.Contains(pending, "kubectl -n kube-system logs job/helm-install-zot") {
		t.Errorf("zot with a failed Job: ready %v, pending %q, err %v", ready, pending, err)
	}

	// kip's own Deployments: the console is ready once both have rolled out.
	console := componentNamed(t, comps, "console")
	base := componentNamed(t, comps, "kipper-base")
	if err := kube.Apply(ctx, cl, append(base.Objects, console.Objects...), kube.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	// Right after the apply the rollout can be anywhere (other tests share this cluster, and
	// kwok is fast): until it is done, what is pending names a console Deployment.
	ready, pending, err = console.Status(ctx, cl)
	if err != nil || !ready && !strings.Contains(pending, "Deployment kipper-system/console") {
		t.Errorf("console just applied: ready %v, pending %q, err %v", ready, pending, err)
	}
	waitComponentReady(ctx, t, cl, console)
}

// helmInstallJob is the Job k3s's helm-controller runs to install chart at version: it passes the
// version in the VERSION environment variable of its container.
func fakeHelmInstallJob(chart, version, nodeName string) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "helm-install-" + chart, Namespace: "kube-system"},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Annotations: testenv.FastPodAnnotations()},
				Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					NodeName:      nodeName,
					Containers: []corev1.Container{{Name: "helm", Image: "rancher/klipper-helm",
						Env: []corev1.EnvVar{{Name: "NAME", Value: chart}, {Name: "VERSION", Value: version}}}},
				},
			},
		},
	}
}

func createHelmJob(ctx context.Context, t *testing.T, cl *kube.Clients, job *batchv1.Job) {
	t.Helper()
	if _, err := cl.Kube.BatchV1().Jobs(job.Namespace).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func deleteHelmJob(ctx context.Context, t *testing.T, cl *kube.Clients, name string) {
	t.Helper()
	jobs := cl.Kube.BatchV1().Jobs("kube-system")
	if err := jobs.Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := jobs.Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return
		}
		pause(ctx, t)
	}
}

func waitComponentReady(ctx context.Context, t *testing.T, cl *kube.Clients, c Component) {
	t.Helper()
	var last string
	for {
		ready, pending, err := c.Status(ctx, cl)
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		if ready {
			return
		}
		last = pending
		select {
		case <-ctx.Done():
			t.Fatalf("%s not ready: %s", c.Name, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func pause(ctx context.Context, t *testing.T) {
	t.Helper()
	select {
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	case <-time.After(200 * time.Millisecond):
	}
}

// TestApplyAfterOnceReady: Apply applies a component's After objects once the rest is ready, not
// while it waits for the rollout (at every poll, their writes would number as many as the
// rollout took polls), and then they hold as rendered.
func TestApplyAfterOnceReady(t *testing.T) {
	env, cl := apiTestClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	node := env.AddNode(t, "after-once-node", testenv.NodeOptions{})
	chart := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "helm.cattle.io/v1", "kind": "HelmChart",
		"metadata": map[string]any{"name": "after-once", "namespace": "kube-system"},
		"spec":     map[string]any{"chart": "after-once", "version": "1.0.0"},
	}}
	after := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "after-once", "namespace": "default"},
		"data":     map[string]any{"setting": "pinned"},
	}}
	c := Component{Name: "after-once", Objects: []*unstructured.Unstructured{chart}, After: []*unstructured.Unstructured{after}}
	// The chart as rendered, and no helm-install Job yet: Apply waits for it, polling from the
	// start, until its context ends.
	if err := kube.Apply(ctx, cl, c.Objects, kube.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCtx, waitCancel := context.WithTimeout(ctx, 20*time.Second)
	err := Apply(waitCtx, cl, c)
	waitCancel()
	if err == nil || !strings.Contains(err.Error(), "after-once to roll out") || !strings.Contains(err.Error(), "Job helm-install-after-once not created yet") {
		t.Fatalf("Apply before the chart's Job: %v; want it stopped waiting for the Job", err)
	}
	configMaps := cl.Kube.CoreV1().ConfigMaps("default")
	if _, err := configMaps.Get(ctx, "after-once", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the After object while the chart's Job was missing: %v; want it not applied yet", err)
	}
	createHelmJob(ctx, t, cl, fakeHelmInstallJob("after-once", "1.0.0", node.Name))
	if err := Apply(ctx, cl, c); err != nil {
		t.Fatal(err)
	}
	if cm, err := configMaps.Get(ctx, "after-once", metav1.GetOptions{}); err != nil || cm.Data["setting"] != "pinned" {
		t.Fatalf("the After object once the chart is ready: %v, %v", cm, err)
	}
}

// TestApplyReplacesClass: a StorageClass kip defines whose parameters changed since it was made
// (the one-copy class before it selected the server's tag) is made anew, as Kubernetes forbids
// changing them; Longhorn's stock class, of which kip applies only an annotation, stays. Stopped
// after the delete, before the create, the next Apply makes it.
func TestApplyReplacesClass(t *testing.T) {
	_, cl := apiTestClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	scs := cl.Kube.StorageV1().StorageClasses()
	old := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: cluster.LonghornOneCopyClass}, Provisioner: "driver.longhorn.io",
		Parameters: map[string]string{"numberOfReplicas": "1", "dataLocality": "disabled", "replicaAutoBalance": "disabled", "staleReplicaTimeout": "30"}}
	stock := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: longhornClass}, Provisioner: "driver.longhorn.io",
		Parameters: map[string]string{"numberOfReplicas": "3"}}
	var uids []types.UID
	for _, sc := range []*storagev1.StorageClass{old, stock} {
		// Other tests of this package apply the classes as rendered.
		if err := scs.Delete(ctx, sc.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		made, err := scs.Create(ctx, sc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		uids = append(uids, made.UID)
		t.Cleanup(func() { _ = scs.Delete(context.Background(), sc.Name, metav1.DeleteOptions{}) })
	}
	comps, err := Render(testOptions(t, "small", cluster.StorageLonghorn))
	if err != nil {
		t.Fatal(err)
	}
	var lh Component
	for _, c := range comps {
		if c.Name == "longhorn" {
			lh = c
		}
	}
	c := Component{Name: "classes", After: slices.DeleteFunc(slices.Clone(lh.After), func(o *unstructured.Unstructured) bool { return o.GetKind() != "StorageClass" })}
	if len(c.After) != 2 {
		t.Fatalf("the longhorn component's classes: %d, want 2", len(c.After))
	}
	if err := Apply(ctx, cl, c); err != nil {
		t.Fatal(err)
	}
	one, err := scs.Get(ctx, cluster.LonghornOneCopyClass, metav1.GetOptions{})
	if err != nil || one.Parameters["nodeSelector"] != longhorn.ServerTag || one.UID == uids[0] {
		t.Errorf("the one-copy class after Apply: %v %v", one.Parameters, err)
	}
	got, err := scs.Get(ctx, longhornClass, metav1.GetOptions{})
	if err != nil || got.UID != uids[1] || got.Parameters["numberOfReplicas"] != "3" || got.Annotations["storageclass.kubernetes.io/is-default-class"] != "false" {
		t.Errorf("Longhorn's class after Apply: %+v %v", got, err)
	}
	if ready, pending, err := c.Status(ctx, cl); err != nil || !ready {
		t.Errorf("the classes after Apply: ready %v, pending %q, %v", ready, pending, err)
	}
	// Killed between the delete and the create (its two writes): the class is missing, the
	// component not ready, and the next Apply makes it as rendered.
	if err := scs.Delete(ctx, cluster.LonghornOneCopyClass, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if ready, _, err := c.Status(ctx, cl); err != nil || ready {
		t.Errorf("the classes with the one-copy class deleted: ready %v, %v", ready, err)
	}
	if err := Apply(ctx, cl, c); err != nil {
		t.Fatal(err)
	}
	if one, err := scs.Get(ctx, cluster.LonghornOneCopyClass, metav1.GetOptions{}); err != nil || one.Parameters["nodeSelector"] != longhorn.ServerTag {
		t.Errorf("the one-copy class after Apply run again: %v %v", one, err)
	}
}

// TestReadRelease reads the release a cluster's Longhorn HelmChart installs, on the real API
// server: none without the HelmChart, then the release of the chart version kip applied.
func TestReadRelease(t *testing.T) {
	_, cl := apiTestClients(t)
	ctx := context.Background()
	charts := cl.Dynamic.Resource(HelmCharts).Namespace(HelmChartNamespace)
	// Another test of this package applies every component, Longhorn's HelmChart among them.
	if err := charts.Delete(ctx, "longhorn", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if v, err := ReadRelease(ctx, cl, "longhorn"); err != nil || v != "" {
		t.Fatalf("without Longhorn's HelmChart: %q, %v", v, err)
	}
	chart := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "helm.cattle.io/v1", "kind": "HelmChart",
		"metadata": map[string]any{"name": "longhorn", "namespace": HelmChartNamespace},
		"spec":     map[string]any{"chart": "longhorn", "repo": "https://charts.longhorn.io", "version": "1.9.2", "targetNamespace": "longhorn-system"},
	}}
	if _, err := charts.Create(ctx, chart, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = charts.Delete(context.Background(), "longhorn", metav1.DeleteOptions{}) })
	if v, err := ReadRelease(ctx, cl, "longhorn"); err != nil || v != "v1.9.2" {
		t.Errorf("with Longhorn's HelmChart at 1.9.2: %q, %v", v, err)
	}
}
