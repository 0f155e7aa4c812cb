package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	helmv1 "github.com/k3s-io/helm-controller/pkg/apis/helm.cattle.io/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsclientset "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"kipper.run/kip/test/helmstandin"
)

// The widgets chart's fixtures: a CRD and one of its resources, a StorageClass, and a ConfigMap
// without a namespace, split over two files.
const (
	widgetsCRDs = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.fixtures.example.com
spec:
  group: fixtures.example.com
  names: {kind: Widget, listKind: WidgetList, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
`
	widgetsObjects = `apiVersion: fixtures.example.com/v1
kind: Widget
metadata:
  name: example
spec:
  size: 3
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: widgets-fast
provisioner: fixtures.example.com/widgets
---
# an empty document, then a ConfigMap
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: widgets-config
data:
  mode: fast
`
)

// gizmosConfig is a fixture of the gizmos chart: a ConfigMap that says which fixtures it came from.
func gizmosConfig(fixtures string) string {
	return "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gizmos-config\ndata:\n  fixtures: \"" + fixtures + "\"\n"
}

var widgetResource = schema.GroupVersionResource{Group: "fixtures.example.com", Version: "v1", Resource: "widgets"}

// TestAddons runs a server and checks what it deploys as k3s would: helm-controller's CRDs, the
// local-path StorageClass, HelmCharts turned into install Jobs that complete (kwok), a new Job
// when a chart's spec changes, chart fixtures; then restarts it, with local-storage re-applied and
// then disabled.
func TestAddons(t *testing.T) {
	t.Parallel() // with TestServerAndAgent, which mostly waits
	binDir := testBinDir(t)
	standinBinary(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	dataDir, kubeconfig, configPath := filepath.Join(dir, "data"), filepath.Join(dir, "k3s.yaml"), filepath.Join(dir, "config.yaml")
	charts := filepath.Join(dataDir, "server", "standin-charts")
	writeFile(t, filepath.Join(charts, "widgets", "crds.yaml"), widgetsCRDs)
	writeFile(t, filepath.Join(charts, "widgets", "objects.yaml"), widgetsObjects)
	writeFile(t, filepath.Join(charts, "widgets", "README"), "not a *.yaml file: ignored")
	writeFile(t, filepath.Join(charts, "gizmos", "objects.yaml"), gizmosConfig("any"))
	writeFile(t, filepath.Join(charts, "gizmos", "2.0.0", "objects.yaml"), gizmosConfig("2.0.0"))
	ports := freePortRange(t, 6) // the stand-in's own four, then k3s's and the kubelet's
	config := fmt.Sprintf("node-name: standin-addons\nnode-ip: 127.0.0.1\nbind-address: 127.0.0.1\nhttps-listen-port: %d\nkubelet-arg: [port=%d]\n", ports+4, ports+5)
	writeFile(t, configPath, config)
	args := []string{"server", "--config", configPath, "--data-dir", dataDir, "--write-kubeconfig", kubeconfig}
	env := []string{"KIP_STANDIN_BIN=" + binDir, "KIP_STANDIN_PORT_BASE=" + strconv.Itoa(ports)}

	server := startStandin(t, dir, "server", args, env)
	t.Logf("server start (process start to READY=1): %s", server.waitReady(t, 2*time.Minute).Round(time.Millisecond))
	restCfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	kube := kubernetes.NewForConfigOrDie(restCfg)
	dyn := dynamic.NewForConfigOrDie(restCfg)
	ext := apiextensionsclientset.NewForConfigOrDie(restCfg)

	t.Run("CRDs established at READY", func(t *testing.T) {
		if err := helmstandin.CRDsEstablished(ctx, ext, []string{"helmcharts.helm.cattle.io", "helmchartconfigs.helm.cattle.io"}); err != nil {
			t.Error(err)
		}
	})

	t.Run("local-path default storage class", func(t *testing.T) {
		sc, err := kube.StorageV1().StorageClasses().Get(ctx, "local-path", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sc.Provisioner != "rancher.io/local-path" || *sc.VolumeBindingMode != "WaitForFirstConsumer" || *sc.ReclaimPolicy != corev1.PersistentVolumeReclaimDelete ||
			sc.Annotations["storageclass.kubernetes.io/is-default-class"] != "true" {
			t.Errorf("local-path = provisioner %s, binding %s, reclaim %s, annotations %v", sc.Provisioner, *sc.VolumeBindingMode, *sc.ReclaimPolicy, sc.Annotations)
		}
		if !slices.ContainsFunc(sc.ManagedFields, func(f metav1.ManagedFieldsEntry) bool {
			return f.Manager == "deploy" && f.Operation == metav1.ManagedFieldsOperationApply
		}) {
			t.Errorf("local-path not applied by field manager deploy: %v", sc.ManagedFields)
		}
	})

	t.Run("HelmChart install job", func(t *testing.T) {
		createChart(ctx, t, dyn, "demo", helmv1.HelmChartSpec{
			Chart: "demo", Repo: "https://charts.example.com", Version: "1.0.0",
			TargetNamespace: "demo-system", CreateNamespace: true, ValuesContent: "replicas: 2\n",
		})
		first := waitJob(ctx, t, kube, "demo", "1.0.0", "")
		c := first.Spec.Template.Spec.Containers
		if first.Labels["helmcharts.helm.cattle.io/chart"] != "demo" || len(c) != 1 || c[0].Name != "helm" ||
			!strings.HasPrefix(c[0].Image, "rancher/klipper-helm:v") {
			t.Errorf("job labels %v, containers %+v", first.Labels, c)
		}
		for k, v := range map[string]string{"NAME": "demo", "REPO": "https://charts.example.com", "CHART": "demo/demo", "TARGET_NAMESPACE": "demo-system"} {
			if got := jobEnv(first, k); got != v {
				t.Errorf("job env %s = %q, want %q", k, got, v)
			}
		}
		if o := first.OwnerReferences; len(o) != 1 || o[0].Kind != "HelmChart" || o[0].Name != "demo" || o[0].Controller == nil || !*o[0].Controller {
			t.Errorf("job owner references %+v", o)
		}
		if _, err := kube.CoreV1().Namespaces().Get(ctx, "demo-system", metav1.GetOptions{}); err != nil {
			t.Errorf("createNamespace: %v", err)
		}
		began := time.Now()
		waitComplete(ctx, t, kube, first.Name, first.UID)
		t.Logf("install job complete %s after it was seen", time.Since(began).Round(time.Millisecond))
		chart := getChart(ctx, t, dyn, "demo")
		if chart.Status.JobName != "helm-install-demo" || len(chart.Status.Conditions) == 0 ||
			chart.Status.Conditions[0].Type != helmv1.HelmChartJobCreated || chart.Status.Conditions[0].Status != corev1.ConditionTrue {
			t.Errorf("chart status %+v", chart.Status)
		}

		// A new version: the Job is replaced.
		patch := []byte(`{"spec":{"version":"1.1.0"}}`)
		if _, err := dyn.Resource(helmstandin.ChartResource).Namespace("kube-system").Patch(ctx, "demo", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		second := waitJob(ctx, t, kube, "demo", "1.1.0", first.UID)
		if h1, h2 := first.Spec.Template.Annotations[helmstandin.AnnotationConfigHash], second.Spec.Template.Annotations[helmstandin.AnnotationConfigHash]; h1 == h2 || !strings.HasPrefix(h2, "SHA256=") {
			t.Errorf("config hash %q after %q", h2, h1)
		}
		waitComplete(ctx, t, kube, second.Name, second.UID)

		// A chart deleted and created again at once gets a Job of its own, while the garbage
		// collector removes the old chart's Job and service account.
		if err := dyn.Resource(helmstandin.ChartResource).Namespace("kube-system").Delete(ctx, "demo", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		again := createChart(ctx, t, dyn, "demo", helmv1.HelmChartSpec{Chart: "demo", Repo: "https://charts.example.com", Version: "1.1.0"})
		third := waitJob(ctx, t, kube, "demo", "1.1.0", second.UID)
		if !metav1.IsControlledBy(third, again) {
			t.Errorf("job after the chart was created again: owner %+v, want chart %s", third.OwnerReferences, again.GetUID())
		}
		waitComplete(ctx, t, kube, third.Name, third.UID)

		// Deleting the chart deletes its Job (garbage collection).
		if err := dyn.Resource(helmstandin.ChartResource).Namespace("kube-system").Delete(ctx, "demo", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, time.Minute, "job deleted with its chart", func() error {
			_, err := kube.BatchV1().Jobs("kube-system").Get(ctx, "helm-install-demo", metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("job still there: %v", err)
		})
	})

	var widgetsJob types.UID
	t.Run("chart fixtures", func(t *testing.T) {
		createChart(ctx, t, dyn, "widgets", helmv1.HelmChartSpec{Chart: "oci://charts.example.com/widgets", Version: "0.3.0", TargetNamespace: "widgets-system", CreateNamespace: true})
		job := waitJob(ctx, t, kube, "widgets", "0.3.0", "")
		widgetsJob = job.UID
		// The fixtures were applied before the Job was created.
		cm, err := kube.CoreV1().ConfigMaps("widgets-system").Get(ctx, "widgets-config", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("fixture ConfigMap in the target namespace: %v", err)
		}
		if cm.Data["mode"] != "fast" || cm.Labels["app.kubernetes.io/managed-by"] != "Helm" || cm.Annotations["meta.helm.sh/release-name"] != "widgets" ||
			!slices.ContainsFunc(cm.ManagedFields, func(f metav1.ManagedFieldsEntry) bool { return f.Manager == "k3s-standin-helm" }) {
			t.Errorf("fixture ConfigMap: data %v, labels %v, annotations %v, managed fields %v", cm.Data, cm.Labels, cm.Annotations, cm.ManagedFields)
		}
		if err := helmstandin.CRDsEstablished(ctx, ext, []string{"widgets.fixtures.example.com"}); err != nil {
			t.Error(err)
		}
		w, err := dyn.Resource(widgetResource).Namespace("widgets-system").Get(ctx, "example", metav1.GetOptions{})
		if err != nil {
			t.Errorf("fixture Widget: %v", err)
		} else if size, _, _ := unstructured.NestedInt64(w.Object, "spec", "size"); size != 3 {
			t.Errorf("fixture Widget spec %v", w.Object["spec"])
		}
		if _, err := kube.StorageV1().StorageClasses().Get(ctx, "widgets-fast", metav1.GetOptions{}); err != nil {
			t.Errorf("fixture StorageClass: %v", err)
		}
		ns, err := kube.CoreV1().Namespaces().Get(ctx, "widgets-system", metav1.GetOptions{})
		if err != nil || ns.Labels["name"] != "widgets-system" {
			t.Errorf("target namespace: %v, %v", ns, err)
		}
		waitComplete(ctx, t, kube, job.Name, job.UID)
	})

	t.Run("a version's own fixtures", func(t *testing.T) {
		// The chart's directory holds the fixtures of any version; its 2.0.0 subdirectory those of 2.0.0.
		createChart(ctx, t, dyn, "gizmos", helmv1.HelmChartSpec{Chart: "gizmos", Repo: "https://charts.example.com", Version: "1.0.0", TargetNamespace: "gizmos-system", CreateNamespace: true})
		for _, version := range []string{"1.0.0", "2.0.0"} {
			if version != "1.0.0" {
				patch := []byte(`{"spec":{"version":"` + version + `"}}`)
				if _, err := dyn.Resource(helmstandin.ChartResource).Namespace("kube-system").Patch(ctx, "gizmos", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			waitJob(ctx, t, kube, "gizmos", version, "")
			want := map[string]string{"1.0.0": "any", "2.0.0": "2.0.0"}[version]
			cm, err := kube.CoreV1().ConfigMaps("gizmos-system").Get(ctx, "gizmos-config", metav1.GetOptions{})
			if err != nil || cm.Data["fixtures"] != want {
				t.Errorf("gizmos %s: its ConfigMap %v, %v; want the fixtures of %s", version, cm.Data, err, want)
			}
		}
	})

	logs := string(readFile(t, server.log))
	if !strings.Contains(logs, "helm: time=") || !strings.Contains(logs, `msg="applying HelmChart"`) {
		t.Errorf("server log has no helm-controller lines prefixed \"helm: \"")
	}

	// Restarts: k3s re-applies its manifests, undoing a change to local-path; an unchanged chart
	// keeps its Job. Then with local-storage disabled, local-path goes.
	patch := []byte(`{"metadata":{"annotations":{"storageclass.kubernetes.io/is-default-class":"false"}}}`)
	if _, err := kube.StorageV1().StorageClasses().Patch(ctx, "local-path", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	server.stop(t)
	server = startStandin(t, dir, "server-restarted", args, env)
	t.Logf("server restart (process start to READY=1): %s", server.waitReady(t, 2*time.Minute).Round(time.Millisecond))
	sc, err := kube.StorageV1().StorageClasses().Get(ctx, "local-path", metav1.GetOptions{})
	if err != nil || sc.Annotations["storageclass.kubernetes.io/is-default-class"] != "true" {
		t.Errorf("local-path after a restart: %v, %v; want is-default-class true again", sc.Annotations, err)
	}
	time.Sleep(2 * time.Second) // time for the helm-controller to have looked at the charts
	if job, err := kube.BatchV1().Jobs("kube-system").Get(ctx, "helm-install-widgets", metav1.GetOptions{}); err != nil || job.UID != widgetsJob {
		t.Errorf("widgets job after a restart: %v; want the same job %s", err, widgetsJob)
	}

	server.stop(t)
	writeFile(t, configPath, config+"disable: [traefik, local-storage]\n")
	server = startStandin(t, dir, "server-disabled", args, env)
	t.Logf("server restart with local-storage disabled (process start to READY=1): %s", server.waitReady(t, 2*time.Minute).Round(time.Millisecond))
	if _, err := kube.StorageV1().StorageClasses().Get(ctx, "local-path", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("local-path with local-storage disabled: %v, want NotFound", err)
	}
	if _, err := kube.StorageV1().StorageClasses().Get(ctx, "widgets-fast", metav1.GetOptions{}); err != nil {
		t.Errorf("a chart's StorageClass after disabling local-storage: %v", err)
	}
}

func createChart(ctx context.Context, t *testing.T, dyn dynamic.Interface, name string, spec helmv1.HelmChartSpec) *unstructured.Unstructured {
	t.Helper()
	chart := &helmv1.HelmChart{
		TypeMeta:   metav1.TypeMeta{APIVersion: helmv1.SchemeGroupVersion.String(), Kind: "HelmChart"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system"},
		Spec:       spec,
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(chart)
	if err != nil {
		t.Fatal(err)
	}
	created, err := dyn.Resource(helmstandin.ChartResource).Namespace("kube-system").Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return created
}

func getChart(ctx context.Context, t *testing.T, dyn dynamic.Interface, name string) *helmv1.HelmChart {
	t.Helper()
	u, err := dyn.Resource(helmstandin.ChartResource).Namespace("kube-system").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	chart := &helmv1.HelmChart{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, chart); err != nil {
		t.Fatal(err)
	}
	return chart
}

// waitJob waits for chart's install Job for version, other than the Job not.
func waitJob(ctx context.Context, t *testing.T, kube kubernetes.Interface, chart, version string, not types.UID) *batchv1.Job {
	t.Helper()
	var job *batchv1.Job
	eventually(t, time.Minute, "install job of "+chart+" "+version, func() error {
		j, err := kube.BatchV1().Jobs("kube-system").Get(ctx, "helm-install-"+chart, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if j.UID == not || jobEnv(j, "VERSION") != version {
			return fmt.Errorf("job %s has VERSION %q", j.UID, jobEnv(j, "VERSION"))
		}
		job = j
		return nil
	})
	return job
}

// waitComplete waits for the Job name with uid to be Complete.
func waitComplete(ctx context.Context, t *testing.T, kube kubernetes.Interface, name string, uid types.UID) {
	t.Helper()
	eventually(t, time.Minute, "job "+name+" Complete", func() error {
		j, err := kube.BatchV1().Jobs("kube-system").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if j.UID != uid {
			return fmt.Errorf("job %s replaced", name)
		}
		for _, c := range j.Status.Conditions {
			if c.Type == batchv1.JobComplete && c.Status == corev1.ConditionTrue {
				return nil
			}
		}
		status, _ := json.Marshal(j.Status)
		return fmt.Errorf("job status %s", status)
	})
}

func jobEnv(j *batchv1.Job, name string) string {
	for _, c := range j.Spec.Template.Spec.Containers {
		for _, e := range c.Env {
			if e.Name == name {
				return e.Value
			}
		}
	}
	return ""
}
