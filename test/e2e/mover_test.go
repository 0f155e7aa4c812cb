package e2e_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/mover"
	"kipper.run/kip/internal/mover/moverimage"
	"kipper.run/kip/internal/mover/moverpod"
	"kipper.run/kip/internal/mover/movertest"
	"kipper.run/kip/manifests"
	"kipper.run/kip/test/e2e"
	"kipper.run/kip/test/lab"
)

// moverHost is the data mover test's host (index 7, lab8).
const moverHost = 7

// TestMoverInPods runs the data mover as a move runs it: its image, built from this checkout and
// pinned by digest, imported into the host's containerd; the copy, verify and scan pods kip
// creates (moverpod), as root with only their capabilities, on a real kubelet, between two
// local-path volumes. The copy is checked from outside with find, getfacl and getfattr, and a
// byte changed in the copy makes the verify pod exit with differences naming the file.
func TestMoverInPods(t *testing.T) {
	t.Parallel()
	s := e2e.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	h := s.Own(t, moverHost)[0]
	e2e.LogK3sOnFailure(t, h)
	if err := s.InstallStandin(ctx, h, "server", e2e.ServerConfig(h)); err != nil {
		t.Fatal(err)
	}
	_, _, c := s.Clients(ctx, t, h, h.Name)
	importMoverImage(ctx, t, h)

	// Two local-path volumes, provisioned by a pod that mounts both; the original is filled from
	// outside with every kind of entry.
	for _, name := range []string{"original", "copy"} {
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: ptr.To("local-path"), AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
		if _, err := c.Kube.CoreV1().PersistentVolumeClaims("default").Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	provision := podOn("provision", "", "exit 0") // placed by the scheduler, which binds the claims
	for _, name := range []string{"original", "copy"} {
		provision.Spec.Volumes = append(provision.Spec.Volumes, corev1.Volume{Name: name, VolumeSource: claim(name)})
		provision.Spec.Containers[0].VolumeMounts = append(provision.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: name, MountPath: "/" + name})
	}
	if _, err := c.Kube.CoreV1().Pods("default").Create(ctx, provision, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(ctx, t, c, "provision", corev1.PodSucceeded, 3*time.Minute)
	deletePod(ctx, t, c, "provision")
	original, copyDir := h.Path(claimDir(ctx, t, c, "original")), h.Path(claimDir(ctx, t, c, "copy"))
	movertest.MakeTree(t, original, 0)

	copyRep := runMover(ctx, t, c, mover.OpCopy)
	if copyRep.Result != mover.Done || copyRep.Totals.Files != 15 || copyRep.Totals.HardLinks != 2 {
		t.Fatalf("copy pod: %s, %+v: %s", copyRep.Result, copyRep.Totals, copyRep.Error)
	}
	t.Logf("copy pod: %d entries, %d bytes in %.2f s (%.2f s flushing)", copyRep.Totals.Entries(), copyRep.Totals.Bytes, copyRep.Seconds, copyRep.SyncSeconds)
	if want, got := movertest.Describe(t, original), movertest.Describe(t, copyDir); want != got {
		t.Errorf("the copy pod's copy differs from the original:\n--- original\n%s\n--- copy\n%s", want, got)
	}
	if v := runMover(ctx, t, c, mover.OpVerify); v.Result != mover.Done || v.Totals != copyRep.Totals {
		t.Fatalf("verify pod: %s, %d differences %v, totals %+v: %s", v.Result, v.DifferenceCount, v.Differences, v.Totals, v.Error)
	}
	if sc := runMover(ctx, t, c, mover.OpScan); sc.Result != mover.Done || sc.Totals != copyRep.Totals {
		t.Errorf("scan pod: %s, totals %+v, want %+v", sc.Result, sc.Totals, copyRep.Totals)
	}

	// One byte changed in the copy, its times kept.
	big := filepath.Join(copyDir, "big.bin")
	st, err := os.Stat(big)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(big, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{'!'}, 12345); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Chtimes(big, st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	v := runMover(ctx, t, c, mover.OpVerify)
	if v.Result != mover.Differ || v.DifferenceCount != 1 || v.Differences[0].Path != "big.bin" || v.Differences[0].Attribute != "content" {
		t.Errorf("verify pod after a changed byte: %s, %d differences %v; want big.bin's content", v.Result, v.DifferenceCount, v.Differences)
	}
}

// importMoverImage builds the mover's image from this checkout, checks it is the pinned one, and
// imports it into h's containerd under the pinned reference, as kip's pods name it, for the
// mover's pods this test runs without kip (a move imports the image itself).
func importMoverImage(ctx context.Context, t *testing.T, h *lab.Host) {
	t.Helper()
	idx := movertest.Image(ctx, t)
	const archive = "/var/tmp/kip-mover-image.tar"
	if err := moverimage.WriteArchive(idx, moverPin(t).Reference(), h.Path(archive)); err != nil {
		t.Fatal(err)
	}
	if out, err := h.Run(ctx, e2e.Ctr("images", "import", archive)); err != nil {
		t.Fatalf("import the mover's image: %v\n%s", err, out)
	}
}

// moverPin is the mover's pinned image.
func moverPin(t *testing.T) manifests.MoverImagePin {
	t.Helper()
	pin, err := manifests.MoverImage()
	if err != nil {
		t.Fatal(err)
	}
	return pin
}

// moverImage is the digest the lab host's containerd holds the mover's image as, "" when none.
func (l *moveLab) moverImage(ctx context.Context, t *testing.T) string {
	t.Helper()
	out, err := l.h.Run(ctx, e2e.Ctr("images", "list"))
	if err != nil {
		t.Fatalf("list the host's images: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == moverPin(t).Reference() {
			return f[2]
		}
	}
	return ""
}

// removeMoverImage deletes the mover's image from the lab host's containerd.
func (l *moveLab) removeMoverImage(ctx context.Context, t *testing.T) {
	t.Helper()
	if out, err := l.h.Run(ctx, e2e.Ctr("images", "rm", moverPin(t).Reference())); err != nil {
		t.Fatalf("remove the mover's image: %v\n%s", err, out)
	}
}

func claim(name string) corev1.VolumeSource {
	return corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name}}
}

// claimDir is the local-path directory of a bound claim of namespace default on its node.
func claimDir(ctx context.Context, t *testing.T, c *kube.Clients, name string) string {
	t.Helper()
	return claimDirIn(ctx, t, c, "default", name)
}

// claimDirIn is the local-path directory of a bound claim on its node.
func claimDirIn(ctx context.Context, t testing.TB, c *kube.Clients, namespace, name string) string {
	t.Helper()
	pvc, err := c.Kube.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv, err := c.Kube.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case pv.Spec.HostPath != nil:
		return pv.Spec.HostPath.Path
	case pv.Spec.Local != nil:
		return pv.Spec.Local.Path
	}
	t.Fatalf("volume %s of claim %s is not a local-path directory", pv.Name, name)
	return ""
}

// runMover runs op's pod between the claims original and copy on h and returns what it reported.
func runMover(ctx context.Context, t *testing.T, c *kube.Clients, op mover.Op) *mover.Report {
	t.Helper()
	name := "mover-" + string(op)
	pod, err := moverpod.Pod(moverpod.Spec{Name: name, Namespace: "default", Op: op, Original: claim("original"), Copy: claim("copy")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Kube.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer deletePod(ctx, t, c, name)
	var rep *mover.Report
	err = poll(ctx, 5*time.Minute, name+"'s report", func(ctx context.Context) (bool, error) {
		p, err := c.Kube.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		rep, err = moverpod.Result(ctx, c.Kube, p)
		return rep != nil, err
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, podLog(ctx, c, name))
	}
	return rep
}
