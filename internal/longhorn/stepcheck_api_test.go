package longhorn

import (
	"context"
	"strings"
	"testing"
	"time"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/test/testenv"
)

// TestCheckStep: what keeps a Longhorn step from starting, read from a real API server with
// Longhorn's CRDs: a node under the next release's Kubernetes floor and one out of service, an
// engine image in use whose engine API is older than the next release drives (one no volume
// uses is fine), a faulted volume, one stuck attaching, a replica rebuilding, and, before a
// release without v1beta1, a Longhorn CRD whose objects are still stored as v1beta1 (made as on
// a real cluster: stored through v1beta1 while it was the storage version). The healthy ones
// are not named, and a release that still serves v1beta1 is not blocked by it.
func TestCheckStep(t *testing.T) {
	_, cl, ctx := longhornTestEnv(t)
	node := func(name, kubelet string, taints ...corev1.Taint) {
		t.Helper()
		if _, err := cl.Kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{Taints: taints}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cl.Kube.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
		// A merge patch: the node lifecycle controller changes the Node meanwhile.
		patch := `{"status":{"nodeInfo":{"kubeletVersion":"` + kubelet + `"}}}`
		if _, err := cl.Kube.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatal(err)
		}
	}
	node("sc-old", "v1.33.4+k3s1")
	node("sc-new", "v1.34.1+k3s1")
	node("sc-fenced", "v1.34.1+k3s1", corev1.Taint{Key: cluster.OutOfServiceTaint, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute})

	lh := cl.Longhorn.LonghornV1beta2()
	image := func(name string, cliAPI, ctlAPI, refs int) {
		t.Helper()
		ei, err := lh.EngineImages(Namespace).Create(ctx, &longhornv1beta2.EngineImage{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace},
			Spec: longhornv1beta2.EngineImageSpec{Image: "longhornio/longhorn-engine:" + name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lh.EngineImages(Namespace).Delete(context.Background(), name, metav1.DeleteOptions{}) })
		ei.Status.CLIAPIVersion, ei.Status.ControllerAPIVersion, ei.Status.RefCount = cliAPI, ctlAPI, refs
		if _, err := lh.EngineImages(Namespace).UpdateStatus(ctx, ei, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	image("sc-ei-old", 7, 3, 2)
	image("sc-ei-unused", 7, 3, 0)
	image("sc-ei-new", 10, 5, 3)

	volume := func(name string, state longhornv1beta2.VolumeState, robustness longhornv1beta2.VolumeRobustness) {
		t.Helper()
		v, err := lh.Volumes(Namespace).Create(ctx, &longhornv1beta2.Volume{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace}, Spec: testenv.LonghornVolumeSpec(1<<30, 1)}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lh.Volumes(Namespace).Delete(context.Background(), name, metav1.DeleteOptions{}) })
		v.Status.State, v.Status.Robustness = state, robustness
		if _, err := lh.Volumes(Namespace).UpdateStatus(ctx, v, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	volume("sc-faulted", longhornv1beta2.VolumeStateDetached, longhornv1beta2.VolumeRobustnessFaulted)
	volume("sc-attaching", longhornv1beta2.VolumeStateAttaching, longhornv1beta2.VolumeRobustnessUnknown)
	volume("sc-healthy", longhornv1beta2.VolumeStateAttached, longhornv1beta2.VolumeRobustnessHealthy)
	e, err := lh.Engines(Namespace).Create(ctx, &longhornv1beta2.Engine{ObjectMeta: metav1.ObjectMeta{Name: "sc-healthy-e-0", Namespace: Namespace},
		Spec: longhornv1beta2.EngineSpec{InstanceSpec: longhornv1beta2.InstanceSpec{VolumeName: "sc-healthy", DataEngine: longhornv1beta2.DataEngineTypeV1}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lh.Engines(Namespace).Delete(context.Background(), e.Name, metav1.DeleteOptions{}) })
	e.Status.ReplicaModeMap = map[string]longhornv1beta2.ReplicaMode{"sc-healthy-r-1": "RW", "sc-healthy-r-2": "WO"}
	if _, err := lh.Engines(Namespace).UpdateStatus(ctx, e, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	v1beta1Stored(ctx, t, cl)

	r11, _ := LadderRelease("v1.11.3")
	got, err := CheckStep(ctx, cl, r11)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(got, "\n")
	for _, want := range []string{
		"node sc-old runs Kubernetes v1.33.4+k3s1; Longhorn v1.11.3 needs v1.34 or later on every node: move k3s first with kip upgrade --k3s",
		"node sc-fenced is marked out of service and runs no instance manager: bring it back with kip node add, or remove it with kip node remove sc-fenced --force",
		"engine image sc-ei-old (longhornio/longhorn-engine:sc-ei-old), which 2 volumes use, has engine API 7 and controller API 3; Longhorn v1.11.3 drives engines from 8 and 4",
		"volume sc-faulted is faulted",
		"volume sc-attaching is attaching",
		"volume sc-healthy is rebuilding sc-healthy-r-2",
		"Longhorn v1.11.3 removes longhorn.io/v1beta1, which oldstores.longhorn.io still stores",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("no blocker %q in:\n%s", want, all)
		}
	}
	for _, fine := range []string{"sc-new", "sc-ei-unused", "sc-ei-new", "sc-healthy is faulted", "sc-healthy is attaching"} {
		if strings.Contains(all, fine) {
			t.Errorf("%s named:\n%s", fine, all)
		}
	}
	r8, _ := LadderRelease("v1.8.2")
	got, err = CheckStep(ctx, cl, r8)
	if err != nil {
		t.Fatal(err)
	}
	if all := strings.Join(got, "\n"); strings.Contains(all, "v1beta1") || strings.Contains(all, "sc-old runs") {
		t.Errorf("a step onto 1.8 (v1beta1 served, Kubernetes 1.25) blocked by v1beta1 or the floor:\n%s", all)
	}
}

// v1beta1Stored makes a Longhorn-labelled CRD whose status lists v1beta1 among its stored
// versions as a real cluster comes to: an object written while v1beta1 was the storage version,
// then v1beta2 made the storage version.
func v1beta1Stored(ctx context.Context, t *testing.T, cl *kube.Clients) {
	t.Helper()
	crds := cl.APIExt.ApiextensionsV1().CustomResourceDefinitions()
	schemaAny := &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptr.To(true)}}
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "oldstores.longhorn.io", Labels: map[string]string{"app.kubernetes.io/name": "longhorn"}},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "longhorn.io", Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "oldstores", Singular: "oldstore", Kind: "OldStore", ListKind: "OldStoreList"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{
				{Name: "v1beta1", Served: true, Storage: true, Schema: schemaAny},
				{Name: "v1beta2", Served: true, Storage: false, Schema: schemaAny},
			},
		},
	}
	created, err := crds.Create(ctx, crd, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = crds.Delete(context.Background(), crd.Name, metav1.DeleteOptions{}) })
	gvr := schema.GroupVersionResource{Group: "longhorn.io", Version: "v1beta1", Resource: "oldstores"}
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "longhorn.io/v1beta1", "kind": "OldStore", "metadata": map[string]any{"name": "one", "namespace": Namespace}}}
	if err := kube.Poll(ctx, time.Minute, "the v1beta1 CRD served", func(ctx context.Context) (bool, string, error) {
		_, err := cl.Dynamic.Resource(gvr).Namespace(Namespace).Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		return true, "", nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := kube.Poll(ctx, time.Minute, "v1beta2 the storage version", func(ctx context.Context) (bool, string, error) {
		c, err := crds.Get(ctx, created.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		c.Spec.Versions[0].Storage, c.Spec.Versions[1].Storage = false, true
		if _, err := crds.Update(ctx, c, metav1.UpdateOptions{}); err != nil {
			return false, err.Error(), nil
		}
		return true, "", nil
	}); err != nil {
		t.Fatal(err)
	}
	c, err := crds.Get(ctx, created.Name, metav1.GetOptions{})
	if err != nil || len(c.Status.StoredVersions) != 2 {
		t.Fatalf("the CRD's stored versions: %v, %v", c.Status.StoredVersions, err)
	}
}

// TestCheckManagerCPU: the CPU for the new instance manager of a step, against a real API
// server: a node whose unrequested CPU is short of guaranteed-instance-manager-cpu of its
// allocatable (12.5%, stored per data engine as 1.10 stores it)
// names the older instance manager still reserving its own and the service to lower; a node
// whose Longhorn Node sets instanceManagerCPURequest is measured by that; a roomy node and a
// node where the new manager's pod is already admitted are not named.
func TestCheckManagerCPU(t *testing.T) {
	env, cl, ctx := longhornTestEnv(t)
	ns := env.Namespace(t)
	lh := cl.Longhorn.LonghornV1beta2()
	node := func(name, cpu string, imRequest int) {
		t.Helper()
		if _, err := cl.Kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cl.Kube.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
		patch := `{"status":{"allocatable":{"cpu":"` + cpu + `","memory":"8Gi","pods":"110"},"capacity":{"cpu":"` + cpu + `","memory":"8Gi","pods":"110"}}}`
		if _, err := cl.Kube.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatal(err)
		}
		if _, err := lh.Nodes(Namespace).Create(ctx, &longhornv1beta2.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace},
			Spec: longhornv1beta2.NodeSpec{AllowScheduling: true, InstanceManagerCPURequest: imRequest}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lh.Nodes(Namespace).Delete(context.Background(), name, metav1.DeleteOptions{}) })
	}
	pod := func(namespace, name, nodeName, image, cpu string, labels map[string]string) {
		t.Helper()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels},
			Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c", Image: image,
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}}}}}}
		if _, err := cl.Kube.CoreV1().Pods(namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cl.Kube.CoreV1().Pods(namespace).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		})
	}
	// The share as Longhorn 1.10 stores it: per data engine, and a float.
	if _, err := lh.Settings(Namespace).Create(ctx, &longhornv1beta2.Setting{ObjectMeta: metav1.ObjectMeta{Name: settingManagerCPU, Namespace: Namespace},
		Value: `{"v1":"12.5","v2":"12.5"}`}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = lh.Settings(Namespace).Delete(context.Background(), settingManagerCPU, metav1.DeleteOptions{})
	})
	im := map[string]string{"longhorn.io/component": "instance-manager"}
	node("im-tight", "2", 0)
	pod(Namespace, "instance-manager-old-tight", "im-tight", "longhornio/longhorn-instance-manager:v1.10.2", "240m", im)
	pod(ns, "db-0", "im-tight", "postgres:17", "1600m", nil)
	node("im-own", "1", 500)
	pod(ns, "cache-0", "im-own", "valkey:8", "600m", nil)
	node("im-roomy", "4", 0)
	pod(ns, "web-0", "im-roomy", "nginx", "1", nil)
	node("im-admitted", "1", 0)
	pod(ns, "busy-0", "im-admitted", "busybox", "1", nil)
	pod(Namespace, "instance-manager-new-admitted", "im-admitted", "longhornio/longhorn-instance-manager:v1.11.3", "120m", im)

	r11, _ := LadderRelease("v1.11.3")
	services := map[string][]ServiceCPU{"im-tight": {{Name: "db", Namespace: ns, Project: "shop", Environment: "prod", Request: resource.MustParse("1600m")}}}
	pods, err := cl.Kube.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := CheckManagerCPU(ctx, cl, r11, pods.Items, services)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(got, "\n")
	for _, want := range []string{
		"node im-tight has 160m of CPU unrequested, and Longhorn v1.11.3's new instance manager requests 250m there; its older instance manager instance-manager-old-tight (240m) keeps its reservation until no volume uses it: " +
			"Lower db in " + ns + " from 1600m to 1510m with 'kip service update db --cpu 1510m --project shop --environment prod', or give the node more CPU",
		"node im-own has 400m of CPU unrequested, and Longhorn v1.11.3's new instance manager requests 500m there: give the node more CPU",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("no blocker %q in:\n%s", want, all)
		}
	}
	for _, fine := range []string{"im-roomy", "im-admitted"} {
		if strings.Contains(all, fine) {
			t.Errorf("%s named:\n%s", fine, all)
		}
	}
}

// longhornTestEnv is the shared API test environment with Longhorn's namespace, kip's clients
// for it, and a context that ends with the test (two minutes at most).
func longhornTestEnv(t *testing.T) (*testenv.Env, *kube.Clients, context.Context) {
	t.Helper()
	env := testenv.Get(t)
	cl, err := kube.NewClients(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	if _, err := cl.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return env, cl, ctx
}
