package e2e_test

import (
	"context"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	lh "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/test/e2e"
	"kipper.run/kip/test/longhorn-standin/manager"
	"kipper.run/kip/test/longhorn-standin/standin"
)

// longhornReleasesHost is the Longhorn releases test's host (index 25, lab26).
const longhornReleasesHost = 25

// TestLonghornReleases moves the Longhorn stand-in's chart through releases on a stand-in
// server, with the manager of each release running in the pods of its longhorn-manager
// DaemonSet on the real kubelet: 1.7.3 records itself and starts its instance manager, a pod
// whose CPU request is Longhorn's share of the node's; a skip to 1.9.2 leaves the new manager
// pod ending with Longhorn's refusal in its log and the cluster on 1.7.3; 1.8.2 starts a second
// instance manager while the engine of an attached volume runs in the first; kip's CPU check and
// the kubelet agree on a manager that does not fit (the kubelet refuses its pod as OutOfcpu);
// the volume moves onto 1.9.2's engine while attached, its engine staying in the old instance
// manager until it detaches, when the older managers go; 1.10.2's CRDs apply over a cluster that
// never stored v1beta1, its share of CPU is rewritten per engine, and the API server refuses to
// delete the engine image in use; the data written on 1.7.3 reads back on 1.10.2.
func TestLonghornReleases(t *testing.T) {
	t.Parallel()
	s := e2e.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	h := s.Own(t, longhornReleasesHost)[0]
	e2e.LogK3sOnFailure(t, h)
	standin.LogOnFailure(t, h)
	if err := s.InstallStandin(ctx, h, "server", e2e.ServerConfig(h)); err != nil {
		t.Fatal(err)
	}
	_, _, c := s.Clients(ctx, t, h, h.Name)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if detached, err := standin.Uninstall(ctx, h); err != nil || len(detached) > 0 {
			t.Errorf("the stand-in's uninstall: %v; loop devices still bound (detached now): %v", err, detached)
		}
	})
	start := time.Now()
	if err := e2e.UploadLonghornReleases(ctx, h); err != nil {
		t.Fatal(err)
	}
	t.Logf("the releases' fixtures uploaded and the stand-in's images imported in %s", time.Since(start).Round(100*time.Millisecond))
	lhc := c.Longhorn.LonghornV1beta2()
	node, err := c.Kube.CoreV1().Nodes().Get(ctx, h.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	share := int64(math.Round(float64(node.Status.Allocatable.Cpu().MilliValue()) * 12 / 100))

	release := func(v string) manager.Release {
		t.Helper()
		r, err := manager.Find(v)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// chart moves Longhorn's HelmChart to release v (creating it), as kip's upgrade does.
	chart := func(v string) {
		t.Helper()
		hc := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "helm.cattle.io/v1", "kind": "HelmChart",
			"metadata": map[string]any{"name": "longhorn", "namespace": components.HelmChartNamespace},
			"spec": map[string]any{"chart": "longhorn", "repo": "https://charts.longhorn.io", "version": standin.ChartVersion(v),
				"targetNamespace": standin.Namespace, "createNamespace": true},
		}}
		api := c.Dynamic.Resource(components.HelmCharts).Namespace(components.HelmChartNamespace)
		if _, err := api.Create(ctx, hc, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
			patch := []byte(`{"spec":{"version":"` + standin.ChartVersion(v) + `"}}`)
			_, err = api.Patch(ctx, "longhorn", types.MergePatchType, patch, metav1.PatchOptions{})
			if err != nil {
				t.Fatal(err)
			}
		} else if err != nil {
			t.Fatal(err)
		}
	}
	setting := func(name string) string {
		t.Helper()
		v, err := manager.SettingValue(ctx, c.Longhorn, name)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// rolledOut waits until the manager DaemonSet runs r's image on every node and the manager
	// recorded r.
	rolledOut := func(r manager.Release) {
		t.Helper()
		err := kube.Poll(ctx, 5*time.Minute, "longhorn-manager on "+r.Version, func(ctx context.Context) (bool, string, error) {
			ds, err := c.Kube.AppsV1().DaemonSets(standin.Namespace).Get(ctx, "longhorn-manager", metav1.GetOptions{})
			if err != nil {
				return false, err.Error(), unlessNotFound(err)
			}
			st := ds.Status
			if ds.Spec.Template.Spec.Containers[0].Image != r.ManagerImage() || st.ObservedGeneration < ds.Generation ||
				st.UpdatedNumberScheduled != st.DesiredNumberScheduled || st.NumberAvailable != st.DesiredNumberScheduled || st.DesiredNumberScheduled == 0 {
				return false, "rolling out " + ds.Spec.Template.Spec.Containers[0].Image, nil
			}
			v, err := manager.SettingValue(ctx, c.Longhorn, manager.SettingCurrentVersion)
			return v == r.Version, "current-longhorn-version " + v, err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// instanceManager waits until the node's instance manager of r runs (its pod admitted by the
	// kubelet) and returns its pod.
	instanceManager := func(r manager.Release) *corev1.Pod {
		t.Helper()
		name := manager.InstanceManagerName(h.Name, r.InstanceManagerImage())
		var pod *corev1.Pod
		err := kube.Poll(ctx, 3*time.Minute, "instance manager "+name+" of "+r.Version, func(ctx context.Context) (bool, string, error) {
			im, err := lhc.InstanceManagers(standin.Namespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error(), unlessNotFound(err)
			}
			if pod, err = c.Kube.CoreV1().Pods(standin.Namespace).Get(ctx, name, metav1.GetOptions{}); err != nil {
				return false, err.Error(), unlessNotFound(err)
			}
			return im.Status.CurrentState == lh.InstanceManagerStateRunning && pod.Status.Phase == corev1.PodRunning, string(im.Status.CurrentState), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return pod
	}
	cpu := func(p *corev1.Pod) int64 { return p.Spec.Containers[0].Resources.Requests.Cpu().MilliValue() }
	r17, r18, r19, r110 := release("v1.7.3"), release("v1.8.2"), release("v1.9.2"), release("v1.10.2")

	// 1.7.3 on a new cluster, then the stand-in's plugin and CSI sidecars.
	chart(r17.Version)
	rolledOut(r17)
	if err := standin.Install(ctx, h, c); err != nil {
		t.Fatal(err)
	}
	im17 := instanceManager(r17)
	if cpu(im17) != share || im17.Spec.NodeName != h.Name || im17.Labels["longhorn.io/component"] != "instance-manager" {
		t.Errorf("1.7.3's instance manager %s: %dm on %q, labels %v; want %dm (12%% of the node's allocatable CPU)", im17.Name, cpu(im17), im17.Spec.NodeName, im17.Labels, share)
	}
	if got := setting(manager.SettingManagerCPU); got != "12" {
		t.Errorf("1.7.3's guaranteed-instance-manager-cpu %q, want the plain 12", got)
	}
	setSetting(ctx, t, c, manager.SettingMinimalAvailable, "0") // this machine's disk, shared
	one := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "longhorn-one"}, Provisioner: standin.Driver,
		AllowVolumeExpansion: ptr.To(true), VolumeBindingMode: ptr.To(storagev1.VolumeBindingImmediate),
		Parameters: map[string]string{"numberOfReplicas": "1", "dataLocality": "disabled", "fsType": "ext4"}}
	if _, err := c.Kube.StorageV1().StorageClasses().Create(ctx, one, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pvc := standin.Claim("data", "default", "64Mi")
	pvc.Spec.StorageClassName = ptr.To(one.Name)
	vol, err := standin.CreateClaimOf(ctx, c, pvc)
	if err != nil {
		t.Fatal(err)
	}
	const content = "written on Longhorn 1.7.3"
	writer := podOn("writer", "", "echo '"+content+"' > /data/hello && sync && echo written && trap 'exit 0' TERM && while :; do sleep 1; done")
	mountClaim(writer, "data", false)
	if _, err := c.Kube.CoreV1().Pods("default").Create(ctx, writer, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, 3*time.Minute, "writer's file written", func(ctx context.Context) (bool, error) {
		return strings.Contains(podLog(ctx, c, "writer"), "written"), nil
	}); err != nil {
		t.Fatal(err)
	}
	if v := waitVolume(ctx, t, c, vol, lh.VolumeStateAttached); v.Status.Robustness != lh.VolumeRobustnessHealthy || v.Status.CurrentImage != r17.EngineImage() {
		t.Fatalf("volume %s attached: %s on %s", vol, v.Status.Robustness, v.Status.CurrentImage)
	}
	engine := func() *lh.Engine {
		t.Helper()
		e, err := lhc.Engines(standin.Namespace).Get(ctx, vol+"-e-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	if e := engine(); e.Status.InstanceManagerName != im17.Name || e.Status.CurrentImage != r17.EngineImage() {
		t.Errorf("engine of %s: in %q on %s; want in %s on 1.7.3's engine", vol, e.Status.InstanceManagerName, e.Status.CurrentImage, im17.Name)
	}

	// A skipped minor: the new manager's pod ends with Longhorn's refusal, the cluster stays on 1.7.3.
	chart(r19.Version)
	refusal := "failed to upgrade since upgrading from v1.7.3 to v1.9.2 for minor version is not supported"
	if err := poll(ctx, 3*time.Minute, "1.9.2's manager refusing to start", func(ctx context.Context) (bool, error) {
		pods, err := c.Kube.CoreV1().Pods(standin.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=longhorn-manager"})
		if err != nil {
			return false, err
		}
		for _, p := range pods.Items {
			if p.Spec.Containers[0].Image != r19.ManagerImage() {
				continue
			}
			for _, previous := range []bool{false, true} {
				out, _ := c.Kube.CoreV1().Pods(standin.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: "longhorn-manager", Previous: previous}).DoRaw(ctx)
				if strings.Contains(string(out), refusal) {
					return true, nil
				}
			}
		}
		return false, nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := setting(manager.SettingCurrentVersion); got != r17.Version {
		t.Errorf("after the refused skip, current-longhorn-version %q", got)
	}

	// 1.8.2: a second instance manager; the first stays while the engine runs in it.
	chart(r18.Version)
	rolledOut(r18)
	instanceManager(r18)
	if _, err := c.Kube.CoreV1().Pods(standin.Namespace).Get(ctx, im17.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("1.7.3's instance manager went while the engine of %s runs in it: %v", vol, err)
	}

	// A node whose Longhorn Node asks more CPU for its instance managers than is left: kip's check
	// before the step names it, and the kubelet refuses the new manager's pod.
	setManagerCPU := func(m int) {
		t.Helper()
		patch := []byte(`{"spec":{"instanceManagerCPURequest":` + strconv.Itoa(m) + `}}`)
		if _, err := lhc.Nodes(standin.Namespace).Patch(ctx, h.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// All of the node's CPU: the older instance manager the engine runs in keeps its own.
	greedy := int(node.Status.Allocatable.Cpu().MilliValue())
	setManagerCPU(greedy)
	next, _ := longhorn.LadderRelease(r19.Version)
	pods, err := c.Kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	blockers, err := longhorn.CheckManagerCPU(ctx, c, next, pods.Items, nil)
	if err != nil {
		t.Fatal(err)
	}
	if all := strings.Join(blockers, "\n"); !strings.Contains(all, "node "+h.Name+" has") || !strings.Contains(all, im17.Name) {
		t.Errorf("kip's CPU check before 1.9.2 with %dm asked: %q; want node %s named, with 1.7.3's instance manager", greedy, blockers, h.Name)
	}
	chart(r19.Version)
	rolledOut(r19)
	im19 := manager.InstanceManagerName(h.Name, r19.InstanceManagerImage())
	if err := poll(ctx, 3*time.Minute, "the kubelet refusing "+im19, func(ctx context.Context) (bool, error) {
		evs, err := c.Kube.CoreV1().Events(standin.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + im19})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Reason == "OutOfcpu" {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatal(err)
	}
	setManagerCPU(0)
	if got := cpu(instanceManager(r19)); got != share {
		t.Errorf("1.9.2's instance manager once the node's request is unset: %dm, want %dm", got, share)
	}

	// The volume moves onto 1.9.2's engine while attached (healthy): its engine stays in 1.7.3's
	// instance manager. Once it detaches, the older instance managers go.
	v, err := lhc.Volumes(standin.Namespace).Get(ctx, vol, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v.Spec.Image = r19.EngineImage()
	if _, err := lhc.Volumes(standin.Namespace).Update(ctx, v, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, time.Minute, vol+" on 1.9.2's engine", func(ctx context.Context) (bool, error) {
		v, err := lhc.Volumes(standin.Namespace).Get(ctx, vol, metav1.GetOptions{})
		return err == nil && v.Status.CurrentImage == r19.EngineImage(), err
	}); err != nil {
		t.Fatal(err)
	}
	if e := engine(); e.Status.CurrentImage != r19.EngineImage() || e.Status.InstanceManagerName != im17.Name || e.Status.CurrentState != lh.InstanceStateRunning {
		t.Errorf("engine of %s after the live move: %s on %s in %q", vol, e.Status.CurrentState, e.Status.CurrentImage, e.Status.InstanceManagerName)
	}
	deletePod(ctx, t, c, "writer")
	waitVolume(ctx, t, c, vol, lh.VolumeStateDetached)
	if err := poll(ctx, 2*time.Minute, "the older instance managers gone", func(ctx context.Context) (bool, error) {
		pods, err := c.Kube.CoreV1().Pods(standin.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "longhorn.io/component=instance-manager"})
		if err != nil {
			return false, err
		}
		return len(pods.Items) == 1 && pods.Items[0].Name == im19, nil
	}); err != nil {
		t.Error(err)
	}

	// 1.10.2: its CRDs (no v1beta1) apply, the share is per engine, the engine image in use stays.
	chart(r110.Version)
	rolledOut(r110)
	instanceManager(r110)
	if got := setting(manager.SettingManagerCPU); got != `{"v1":"12","v2":"12"}` {
		t.Errorf("1.10.2's guaranteed-instance-manager-cpu %q", got)
	}
	crd, err := c.APIExt.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, "volumes.longhorn.io", metav1.GetOptions{})
	if err != nil || crd.Labels["app.kubernetes.io/version"] != r110.Version || len(crd.Spec.Versions) != 1 {
		t.Errorf("volumes.longhorn.io on 1.10.2: %v, %v", crd, err)
	}
	inUse := manager.EngineImageName(r19.EngineImage())
	err = lhc.EngineImages(standin.Namespace).Delete(ctx, inUse, metav1.DeleteOptions{})
	if err == nil || !strings.Contains(err.Error(), "is not allowed while being used") {
		t.Errorf("deleting engine image %s, which %s uses: %v", inUse, vol, err)
	}
	if err := lhc.EngineImages(standin.Namespace).Delete(ctx, manager.EngineImageName(r17.EngineImage()), metav1.DeleteOptions{}); err != nil {
		t.Errorf("deleting 1.7.3's engine image, which nothing uses: %v", err)
	}

	// The data written on 1.7.3 reads back.
	reader := podOn("reader", "", "cat /data/hello")
	mountClaim(reader, "data", true)
	if _, err := c.Kube.CoreV1().Pods("default").Create(ctx, reader, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(ctx, t, c, "reader", corev1.PodSucceeded, 3*time.Minute)
	if got := strings.TrimSpace(podLog(ctx, c, "reader")); got != content {
		t.Errorf("read back %q, want %q", got, content)
	}
	deletePod(ctx, t, c, "reader")
}
