package main

import (
	"context"
	"os"
	"testing"
	"time"

	lh "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/test/longhorn-standin/manager"
	"kipper.run/kip/test/longhorn-standin/standin"
	"kipper.run/kip/test/testenv"
)

// TestMain shares one API test environment among this package's API tests; the others never start it.
func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// TestUpgradeEngines: the controller moves volumes onto the engine image their spec names as
// Longhorn's volume controller does, against the real API server with 1.10.2's CRDs: a detached
// volume at once, an attached healthy one live, a degraded one not, nor one whose engine's
// controller API the new engine does not drive; the engine and copies move before the volume's
// currentImage. With automatic engine upgrade off (Longhorn's default), a volume nobody points
// at the new image stays; with it on, the controller points it there itself.
func TestUpgradeEngines(t *testing.T) {
	env := testenv.Get(t)
	cl, err := kube.NewClients(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	lhc := cl.Longhorn
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := standin.ApplyRelease(ctx, cl, "v1.10.2"); err != nil {
		t.Fatal(err)
	}
	r19, _ := manager.Find("v1.9.2")
	r110, _ := manager.Find("v1.10.2")
	const node = "lh-engines-1"
	for _, r := range []manager.Release{r19, r110} {
		if err := manager.EnsureEngineImage(ctx, lhc, r, node); err != nil {
			t.Fatal(err)
		}
	}
	ancient := "longhornio/longhorn-engine:v1.2.6"
	old := &lh.EngineImage{ObjectMeta: metav1.ObjectMeta{Name: manager.EngineImageName(ancient), Namespace: namespace}, Spec: lh.EngineImageSpec{Image: ancient}}
	if old, err = lhc.LonghornV1beta2().EngineImages(namespace).Create(ctx, old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	old.Status.State, old.Status.ControllerAPIVersion, old.Status.CLIAPIVersion = lh.EngineImageStateDeployed, 3, 6
	if _, err := lhc.LonghornV1beta2().EngineImages(namespace).UpdateStatus(ctx, old, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, value := range map[string]string{manager.SettingDefaultEngineImage: r110.EngineImage(), manager.SettingAutoUpgradeLimit: "0"} {
		if err := manager.SetSetting(ctx, lhc, name, func(string) string { return value }); err != nil {
			t.Fatal(err)
		}
	}
	s := &store{lh: lhc, kube: env.Kube, node: node, controller: true, root: t.TempDir()}
	// volume makes a volume on image in state, its engine and one copy with it.
	volume := func(name, image string, state lh.VolumeState, robustness lh.VolumeRobustness) {
		t.Helper()
		v := &lh.Volume{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Spec: testenv.LonghornVolumeSpec(1<<30, 1)}
		v.Spec.Image = image
		v, err := lhc.LonghornV1beta2().Volumes(namespace).Create(ctx, v, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v.Status.State, v.Status.Robustness, v.Status.CurrentImage = state, robustness, image
		if _, err := lhc.LonghornV1beta2().Volumes(namespace).UpdateStatus(ctx, v, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		inst := lh.InstanceSpec{VolumeName: name, Image: image, DataEngine: lh.DataEngineTypeV1, NodeID: node}
		e, err := lhc.LonghornV1beta2().Engines(namespace).Create(ctx, &lh.Engine{ObjectMeta: metav1.ObjectMeta{Name: engineName(name), Namespace: namespace},
			Spec: lh.EngineSpec{InstanceSpec: inst}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		e.Status.CurrentImage = image
		if _, err := lhc.LonghornV1beta2().Engines(namespace).UpdateStatus(ctx, e, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		r, err := lhc.LonghornV1beta2().Replicas(namespace).Create(ctx, &lh.Replica{ObjectMeta: metav1.ObjectMeta{Name: replicaName(name, 0), Namespace: namespace,
			Labels: map[string]string{"longhornvolume": name}}, Spec: lh.ReplicaSpec{InstanceSpec: inst}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r.Status.CurrentImage = image
		if _, err := lhc.LonghornV1beta2().Replicas(namespace).UpdateStatus(ctx, r, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	point := func(name, image string) {
		t.Helper()
		v, err := lhc.LonghornV1beta2().Volumes(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v.Spec.Image = image
		if _, err := lhc.LonghornV1beta2().Volumes(namespace).Update(ctx, v, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pass := func() {
		t.Helper()
		vols, err := lhc.LonghornV1beta2().Volumes(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.upgradeEngines(ctx, vols.Items); err != nil {
			t.Fatal(err)
		}
	}
	// on reports the image volume name's engine, copy and volume are on.
	on := func(name string) (engine, replica, vol string) {
		t.Helper()
		e, err := lhc.LonghornV1beta2().Engines(namespace).Get(ctx, engineName(name), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r, err := lhc.LonghornV1beta2().Replicas(namespace).Get(ctx, replicaName(name, 0), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v, err := lhc.LonghornV1beta2().Volumes(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if e.Spec.Image != e.Status.CurrentImage || r.Spec.Image != r.Status.CurrentImage {
			t.Errorf("volume %s: engine %s → %s, copy %s → %s", name, e.Spec.Image, e.Status.CurrentImage, r.Spec.Image, r.Status.CurrentImage)
		}
		return e.Status.CurrentImage, r.Status.CurrentImage, v.Status.CurrentImage
	}
	check := func(name, want string) {
		t.Helper()
		if e, r, v := on(name); e != want || r != want || v != want {
			t.Errorf("volume %s: engine on %s, copy on %s, volume on %s; want all on %s", name, e, r, v, want)
		}
	}

	volume("eng-detached", r19.EngineImage(), lh.VolumeStateDetached, lh.VolumeRobustnessUnknown)
	volume("eng-healthy", r19.EngineImage(), lh.VolumeStateAttached, lh.VolumeRobustnessHealthy)
	volume("eng-degraded", r19.EngineImage(), lh.VolumeStateAttached, lh.VolumeRobustnessDegraded)
	volume("eng-ancient", ancient, lh.VolumeStateAttached, lh.VolumeRobustnessHealthy)
	volume("eng-untouched", r19.EngineImage(), lh.VolumeStateDetached, lh.VolumeRobustnessUnknown)
	for _, name := range []string{"eng-detached", "eng-healthy", "eng-degraded", "eng-ancient"} {
		point(name, r110.EngineImage())
	}
	pass()
	check("eng-detached", r110.EngineImage())
	check("eng-healthy", r110.EngineImage())
	check("eng-degraded", r19.EngineImage())
	check("eng-ancient", ancient)
	check("eng-untouched", r19.EngineImage())

	// Automatic engine upgrade on: the volume nobody pointed moves too; the degraded one still waits.
	if err := manager.SetSetting(ctx, lhc, manager.SettingAutoUpgradeLimit, func(string) string { return "1" }); err != nil {
		t.Fatal(err)
	}
	pass()
	check("eng-untouched", r110.EngineImage())
	check("eng-degraded", r19.EngineImage())
}
