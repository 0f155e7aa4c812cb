package manager_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	lh "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/test/longhorn-standin/manager"
	"kipper.run/kip/test/longhorn-standin/standin"
	"kipper.run/kip/test/testenv"
)

// TestMain shares one API test environment among this package's tests.
func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// TestManagerReleases walks a node's manager up Longhorn's releases against the real API server,
// with each release's CRDs applied as its chart applies them: each start records the release,
// its images and its engine image; the instance manager's pod requests Longhorn's share of the
// node's CPU (the setting plain to 1.9, per engine from 1.10, as the upgrade to 1.10 rewrites
// it); a skipped minor, a downgrade and an engine below the next release's minimum are refused
// with Longhorn's messages and change nothing; the older instance manager stays while an engine
// runs in it and goes once none does; from 1.10 the API server refuses to delete an engine image
// in use or the default one.
func TestManagerReleases(t *testing.T) {
	env := testenv.Get(t)
	cl, err := kube.NewClients(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	lhc := cl.Longhorn
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const node = "lh-manager-1"
	env.AddNode(t, node, testenv.NodeOptions{CPU: "2"})
	chart := func(version string) {
		t.Helper()
		if err := standin.ApplyRelease(ctx, cl, version); err != nil {
			t.Fatal(err)
		}
	}
	start := func(version string) (*manager.Manager, error) {
		t.Helper()
		r, err := manager.Find(version)
		if err != nil {
			t.Fatal(err)
		}
		m := &manager.Manager{Kube: env.Kube, LH: lhc, Node: node, Release: r}
		return m, m.Start(ctx)
	}
	setting := func(name string) string {
		t.Helper()
		v, err := manager.SettingValue(ctx, lhc, name)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// runningIM reconciles until the node's instance manager of version runs, and returns its pod.
	runningIM := func(m *manager.Manager) *corev1.Pod {
		t.Helper()
		name := manager.InstanceManagerName(node, m.Release.InstanceManagerImage())
		var pod *corev1.Pod
		err := kube.Poll(ctx, time.Minute, "instance manager "+name+" running", func(ctx context.Context) (bool, string, error) {
			if err := m.Reconcile(ctx); err != nil {
				return false, "", err
			}
			im, err := lhc.LonghornV1beta2().InstanceManagers(manager.Namespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error(), nil
			}
			if pod, err = env.Kube.CoreV1().Pods(manager.Namespace).Get(ctx, name, metav1.GetOptions{}); err != nil {
				return false, err.Error(), nil
			}
			return im.Status.CurrentState == lh.InstanceManagerStateRunning, string(im.Status.CurrentState), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return pod
	}
	cpu := func(p *corev1.Pod) int64 { return p.Spec.Containers[0].Resources.Requests.Cpu().MilliValue() }

	// 1.7.3 on a new cluster.
	chart("v1.7.3")
	if err := lhc.LonghornV1beta2().Nodes(manager.Namespace).Delete(ctx, node, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if _, err := lhc.LonghornV1beta2().Nodes(manager.Namespace).Create(ctx, &lh.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: manager.Namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	m17, err := start("v1.7.3")
	if err != nil {
		t.Fatal(err)
	}
	if got := setting(manager.SettingCurrentVersion); got != "v1.7.3" {
		t.Errorf("current-longhorn-version %q", got)
	}
	if got := setting(manager.SettingManagerCPU); got != "12" {
		t.Errorf("1.7's guaranteed-instance-manager-cpu %q, want plain 12", got)
	}
	ei17 := manager.EngineImageName(m17.Release.EngineImage())
	ei, err := lhc.LonghornV1beta2().EngineImages(manager.Namespace).Get(ctx, ei17, metav1.GetOptions{})
	if err != nil || ei.Status.ControllerAPIVersion != 5 || ei.Status.CLIAPIMinVersion != 8 || ei.Status.State != lh.EngineImageStateDeployed {
		t.Fatalf("1.7.3's engine image %s: %+v, %v", ei17, ei, err)
	}
	im17 := runningIM(m17)
	if got := cpu(im17); got != 240 {
		t.Errorf("1.7.3's instance manager requests %dm, want 12%% of 2000m", got)
	}
	if im17.Labels["longhorn.io/component"] != "instance-manager" || im17.Labels["longhorn.io/node"] != node || im17.Spec.NodeName != node {
		t.Errorf("instance manager pod %s: labels %v, node %q", im17.Name, im17.Labels, im17.Spec.NodeName)
	}
	// A volume attached, its engine running in 1.7.3's instance manager.
	vol := &lh.Volume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-ladder", Namespace: manager.Namespace}, Spec: testenv.LonghornVolumeSpec(1<<30, 1)}
	vol.Spec.Image = m17.Release.EngineImage()
	if _, err := lhc.LonghornV1beta2().Volumes(manager.Namespace).Create(ctx, vol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eng := &lh.Engine{ObjectMeta: metav1.ObjectMeta{Name: "pvc-ladder-e-0", Namespace: manager.Namespace}, Spec: lh.EngineSpec{InstanceSpec: lh.InstanceSpec{VolumeName: "pvc-ladder", Image: m17.Release.EngineImage(), NodeID: node, DataEngine: lh.DataEngineTypeV1}}}
	if eng, err = lhc.LonghornV1beta2().Engines(manager.Namespace).Create(ctx, eng, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eng.Status.CurrentState, eng.Status.CurrentImage, eng.Status.InstanceManagerName = lh.InstanceStateRunning, m17.Release.EngineImage(), im17.Name
	if eng, err = lhc.LonghornV1beta2().Engines(manager.Namespace).UpdateStatus(ctx, eng, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := m17.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if ei, _ = lhc.LonghornV1beta2().EngineImages(manager.Namespace).Get(ctx, ei17, metav1.GetOptions{}); ei.Status.RefCount != 2 || ei.Status.NoRefSince != "" {
		t.Errorf("1.7.3's engine image with a volume and its engine: refCount %d, noRefSince %q", ei.Status.RefCount, ei.Status.NoRefSince)
	}

	// Refused: a skipped minor. Nothing changes.
	chart("v1.9.2")
	if _, err := start("v1.9.2"); err == nil || err.Error() != "failed to upgrade since upgrading from v1.7.3 to v1.9.2 for minor version is not supported" {
		t.Errorf("1.7.3 → 1.9.2: %v", err)
	}
	if got := setting(manager.SettingCurrentVersion); got != "v1.7.3" {
		t.Errorf("after a refused start, current-longhorn-version %q", got)
	}
	// Refused: an engine in use below the next release's minimum.
	oldImage := "longhornio/longhorn-engine:v1.2.6"
	old := &lh.EngineImage{ObjectMeta: metav1.ObjectMeta{Name: manager.EngineImageName(oldImage), Namespace: manager.Namespace}, Spec: lh.EngineImageSpec{Image: oldImage}}
	if old, err = lhc.LonghornV1beta2().EngineImages(manager.Namespace).Create(ctx, old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	old.Status.RefCount, old.Status.CLIAPIVersion, old.Status.ControllerAPIVersion = 1, 6, 3
	if _, err := lhc.LonghornV1beta2().EngineImages(manager.Namespace).UpdateStatus(ctx, old, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	chart("v1.8.2")
	want := fmt.Sprintf("failed checking Engine upgrade path: incompatible Engine %s controller API version: found version 3 is below required minimal version 4", old.Name)
	if _, err := start("v1.8.2"); err == nil || err.Error() != want {
		t.Errorf("1.8.2 over an engine of controller API 3: %v", err)
	}
	if err := lhc.LonghornV1beta2().EngineImages(manager.Namespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// 1.8.2: a second instance manager; the first stays while the engine runs in it.
	m18, err := start("v1.8.2")
	if err != nil {
		t.Fatal(err)
	}
	im18 := runningIM(m18)
	if im18.Name == im17.Name || cpu(im18) != 240 {
		t.Errorf("1.8.2's instance manager %s (%dm) beside 1.7.3's %s", im18.Name, cpu(im18), im17.Name)
	}
	if _, err := env.Kube.CoreV1().Pods(manager.Namespace).Get(ctx, im17.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("1.7.3's instance manager went while an engine runs in it: %v", err)
	}
	// Refused: a downgrade.
	chart("v1.8.2")
	if _, err := start("v1.7.3"); err == nil || err.Error() != "failed to upgrade since downgrading from v1.8.2 to v1.7.3 is not supported" {
		t.Errorf("1.8.2 → 1.7.3: %v", err)
	}

	// 1.9.2, then 1.10.2: the share becomes JSON per engine, and a node's own request wins.
	chart("v1.9.2")
	if _, err := start("v1.9.2"); err != nil {
		t.Fatal(err)
	}
	if got := setting(manager.SettingManagerCPU); got != "12" {
		t.Errorf("1.9's guaranteed-instance-manager-cpu %q", got)
	}
	if err := manager.SetSetting(ctx, lhc, manager.SettingManagerCPU, func(string) string { return "15" }); err != nil {
		t.Fatal(err)
	}
	chart("v1.10.2")
	m110, err := start("v1.10.2")
	if err != nil {
		t.Fatal(err)
	}
	if got := setting(manager.SettingManagerCPU); got != `{"v1":"15","v2":"15"}` {
		t.Errorf("1.10's guaranteed-instance-manager-cpu %q, want 1.9's 15 per engine", got)
	}
	if got := cpu(runningIM(m110)); got != 300 {
		t.Errorf("1.10.2's instance manager requests %dm, want 15%% of 2000m", got)
	}
	// From 1.10 the engine image in use, and the default one, cannot be deleted.
	ei110 := manager.EngineImageName(m110.Release.EngineImage())
	for name, msg := range map[string]string{
		ei17:  "deleting engine image " + ei17 + " (" + m17.Release.EngineImage() + ") is not allowed while being used",
		ei110: "deleting the default engine image " + m110.Release.EngineImage() + " (" + m110.Release.EngineImage() + ") is not allowed",
	} {
		err := kube.Poll(ctx, 30*time.Second, "the API server guards "+name, func(ctx context.Context) (bool, string, error) {
			err := lhc.LonghornV1beta2().EngineImages(manager.Namespace).Delete(ctx, name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
			if err == nil {
				return false, "deleted (a dry run)", nil // the policy is not in force yet
			}
			return strings.Contains(err.Error(), msg), err.Error(), nil
		})
		if err != nil {
			t.Error(err)
		}
	}

	// The engine stops: the older instance managers go, 1.10.2's stays.
	eng.Status.CurrentState, eng.Status.InstanceManagerName = lh.InstanceStateStopped, ""
	if _, err := lhc.LonghornV1beta2().Engines(manager.Namespace).UpdateStatus(ctx, eng, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := m110.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	pods, err := env.Kube.CoreV1().Pods(manager.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "longhorn.io/component=instance-manager,longhorn.io/node=" + node})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			names = append(names, p.Name)
		}
	}
	if want := manager.InstanceManagerName(node, m110.Release.InstanceManagerImage()); len(names) != 1 || names[0] != want {
		t.Errorf("instance managers once no engine runs: %v, want only %s", names, want)
	}
}
