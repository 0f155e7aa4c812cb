// Package nodestandin is the API tier's stand-in for what one node does with Kipper's volumes,
// where no kubelet and no Longhorn run: a test tool, never shipped (docs/testing.md).
//
// As the node's kubelet, it runs each pod bound to the node at once (Running and Ready, an IP)
// and confirms each deletion at once, as a kubelet does once the containers stopped. A pod of
// the data mover (label kipper.run/mover) runs the real mover, this test binary run again (see
// MoverMain), on the directories its claims stand for, and ends as its container would: exit
// code and termination message.
//
// As Longhorn's CSI driver and provisioner, following the external-provisioner's contract: a
// claim the PV controller hands to driver.longhorn.io (annotation
// volume.kubernetes.io/storage-provisioner) gets a PersistentVolume pvc-<claim UID> bound to it,
// a Longhorn Volume of that name and a directory Dir/longhorn/<volume>; a released volume whose
// policy is Delete is deleted with both. A Longhorn Volume reports attached to the node while a
// pod that is not finished uses its claim (attached when the stand-in's kubelet starts such a
// pod, detached once none is left), and, as Longhorn's PV controller does, the pods of its claim
// in status.kubernetesStatus.workloadsStatus: all of them, by name, the last list kept once none
// is left.
//
// A local volume's directory is its hostPath or local path, as on the node itself.
package nodestandin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/mover"
	"kipper.run/kip/internal/mover/moverpod"
	"kipper.run/kip/test/testenv"
	"kipper.run/kip/test/wake"
)

// Driver is Longhorn's CSI driver name.
const Driver = "driver.longhorn.io"

// Annotations of the external-provisioner's contract.
const (
	provisionerAnnotation = "volume.kubernetes.io/storage-provisioner"
	provisionedBy         = "pv.kubernetes.io/provisioned-by"
)

// moverEnv, set, makes the test binary run the mover with its arguments (MoverMain).
const moverEnv = "KIP_NODESTANDIN_MOVER"

// MoverMain runs the data mover, as its container would, when the test binary was started by
// the stand-in for a mover pod; it never returns then. A test package that runs the stand-in
// calls it first thing in TestMain.
func MoverMain() {
	if os.Getenv(moverEnv) == "" {
		return
	}
	os.Exit(mover.Main(os.Args[1:], os.Stdout, os.Stderr))
}

// Standin is one node's kubelet and Longhorn, for the pods bound to Node and Longhorn's claims.
type Standin struct {
	Clients *kube.Clients
	Node    string
	// Dir holds the Longhorn volumes' data, one directory each.
	Dir string
	// Logf receives what fails.
	Logf func(format string, args ...any)

	mu      sync.Mutex
	started map[types.UID]bool // mover pods whose run started
	running sync.WaitGroup
}

// resync is how often the stand-in looks at the cluster when nothing it watches changed.
const resync = time.Second

// Run acts until ctx ends, and waits for the mover runs it started: on every change to the
// claims, volumes, pods and Longhorn volumes it looks at, as a kubelet or a provisioner reacts
// to its watches.
func (s *Standin) Run(ctx context.Context) {
	defer s.running.Wait()
	l := wake.New()
	core := s.Clients.Kube.CoreV1().RESTClient()
	l.Watch(ctx, cache.NewListWatchFromClient(core, "persistentvolumeclaims", "", fields.Everything()), &corev1.PersistentVolumeClaim{})
	l.Watch(ctx, cache.NewListWatchFromClient(core, "persistentvolumes", "", fields.Everything()), &corev1.PersistentVolume{})
	l.Watch(ctx, cache.NewListWatchFromClient(core, "pods", "", fields.Everything()), &corev1.Pod{})
	l.Watch(ctx, cache.NewListWatchFromClient(s.Clients.Longhorn.LonghornV1beta2().RESTClient(), "volumes", longhorn.Namespace, fields.Everything()), &longhornv1beta2.Volume{})
	l.Run(ctx, resync, func() {
		for _, err := range []error{s.provision(ctx), s.release(ctx), s.pods(ctx), s.attachments(ctx)} {
			if err != nil && ctx.Err() == nil {
				s.Logf("node stand-in %s: %v", s.Node, err)
			}
		}
	})
}

// VolumeDir is the directory that holds Longhorn volume name's data.
func (s *Standin) VolumeDir(name string) string { return filepath.Join(s.Dir, "longhorn", name) }

// provision makes a volume for each claim handed to Longhorn.
func (s *Standin) provision(ctx context.Context) error {
	claims, err := s.Clients.Kube.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	var errs []error
	for i := range claims.Items {
		c := &claims.Items[i]
		if c.Annotations[provisionerAnnotation] != Driver || c.Spec.VolumeName != "" || c.Status.Phase != corev1.ClaimPending || c.DeletionTimestamp != nil {
			continue
		}
		errs = append(errs, s.provisionOne(ctx, c))
	}
	return errors.Join(errs...)
}

func (s *Standin) provisionOne(ctx context.Context, c *corev1.PersistentVolumeClaim) error {
	class, err := s.Clients.Kube.StorageV1().StorageClasses().Get(ctx, ptr.Deref(c.Spec.StorageClassName, ""), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	name := "pvc-" + string(c.UID)
	size := c.Spec.Resources.Requests[corev1.ResourceStorage]
	if err := os.MkdirAll(s.VolumeDir(name), 0o755); err != nil {
		return err
	}
	v := &longhornv1beta2.Volume{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: longhorn.Namespace},
		Spec: testenv.LonghornVolumeSpec(size.Value(), 1)}
	if _, err := s.Clients.Longhorn.LonghornV1beta2().Volumes(longhorn.Namespace).Create(ctx, v, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create Longhorn volume %s: %w", name, err)
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{provisionedBy: Driver}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   c.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: ptr.Deref(class.ReclaimPolicy, corev1.PersistentVolumeReclaimDelete),
			StorageClassName:              class.Name,
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: c.Namespace, Name: c.Name, UID: c.UID},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: Driver, VolumeHandle: name, FSType: "ext4"}},
		},
	}
	if _, err := s.Clients.Kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create volume %s: %w", name, err)
	}
	return nil
}

// release deletes the released Longhorn volumes whose policy is Delete, their data first.
func (s *Standin) release(ctx context.Context) error {
	pvs, err := s.Clients.Kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	var errs []error
	for _, pv := range pvs.Items {
		if pv.Annotations[provisionedBy] != Driver || pv.Status.Phase != corev1.VolumeReleased ||
			pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete || pv.DeletionTimestamp != nil {
			continue
		}
		if err := os.RemoveAll(s.VolumeDir(pv.Name)); err != nil {
			errs = append(errs, err)
			continue
		}
		err := s.Clients.Longhorn.LonghornV1beta2().Volumes(longhorn.Namespace).Delete(ctx, pv.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
			continue
		}
		err = s.Clients.Kube.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pv.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// pods runs the pods bound to the node and confirms their deletions.
func (s *Standin) pods(ctx context.Context) error {
	pods, err := s.Clients.Kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + s.Node})
	if err != nil {
		return err
	}
	var errs []error
	for i := range pods.Items {
		p := &pods.Items[i]
		switch {
		case p.DeletionTimestamp != nil:
			err := s.Clients.Kube.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
				GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &p.UID}})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				errs = append(errs, err)
			}
		case p.Status.Phase == corev1.PodPending:
			// As a kubelet starts a pod's containers once its volumes are attached.
			if err := s.attach(ctx, p); err != nil {
				errs = append(errs, err)
				continue
			}
			errs = append(errs, s.setStatus(ctx, p, func(p *corev1.Pod) { running(p, s.Node) }))
		case p.Status.Phase == corev1.PodRunning && p.Labels[moverpod.Label] != "":
			s.mu.Lock()
			start := !s.started[p.UID]
			if s.started == nil {
				s.started = map[types.UID]bool{}
			}
			s.started[p.UID] = true
			s.mu.Unlock()
			if start {
				s.running.Add(1)
				go func() {
					defer s.running.Done()
					if err := s.runMover(ctx, p); err != nil && ctx.Err() == nil {
						s.Logf("node stand-in %s: mover pod %s/%s: %v", s.Node, p.Namespace, p.Name, err)
					}
				}()
			}
		}
	}
	return errors.Join(errs...)
}

// running is a pod's status once its containers started.
func running(p *corev1.Pod, node string) {
	now := metav1.Now()
	p.Status.Phase = corev1.PodRunning
	p.Status.HostIP, p.Status.PodIP, p.Status.StartTime = "192.0.2.50", "10.42.0.50", &now
	p.Status.Conditions = nil
	for _, c := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: c, Status: corev1.ConditionTrue, LastTransitionTime: now})
	}
	p.Status.ContainerStatuses = nil
	for _, c := range p.Spec.Containers {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: c.Image,
			ContainerID: "containerd://" + node + "-" + string(p.UID) + "-" + c.Name, Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}})
	}
}

// setStatus changes pod p's status, retried on conflicts, unless it is gone.
func (s *Standin) setStatus(ctx context.Context, p *corev1.Pod, change func(*corev1.Pod)) error {
	pods := s.Clients.Kube.CoreV1().Pods(p.Namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := pods.Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.UID != p.UID {
			return nil
		}
		change(cur)
		_, err = pods.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// runMover runs the mover with the pod's arguments on the directories of its claims, and ends the
// pod as its container would.
func (s *Standin) runMover(ctx context.Context, p *corev1.Pod) error {
	dirs := map[string]string{}
	for _, v := range p.Spec.Volumes {
		if v.PersistentVolumeClaim == nil {
			return fmt.Errorf("volume %s is not a claim", v.Name)
		}
		dir, err := s.claimDir(ctx, p.Namespace, v.PersistentVolumeClaim.ClaimName)
		if err != nil {
			return err
		}
		dirs[v.Name] = dir
	}
	mounts := map[string]string{}
	for _, m := range p.Spec.Containers[0].VolumeMounts {
		mounts[m.MountPath] = dirs[m.Name]
	}
	term, err := os.CreateTemp("", "kip-mover-termination-")
	if err != nil {
		return err
	}
	term.Close()
	defer os.Remove(term.Name())
	args := []string{p.Spec.Containers[0].Args[0], "--termination-log", term.Name()}
	for _, a := range p.Spec.Containers[0].Args[1:] {
		if d, ok := mounts[a]; ok {
			a = d
		}
		args = append(args, a)
	}
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), moverEnv+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	code := 0
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		return err
	}
	msg, err := os.ReadFile(term.Name())
	if err != nil {
		return err
	}
	return s.setStatus(ctx, p, func(p *corev1.Pod) {
		now := metav1.Now()
		phase, reason := corev1.PodSucceeded, "Completed"
		if code != 0 {
			phase, reason = corev1.PodFailed, "Error"
		}
		p.Status.Phase = phase
		for i := range p.Status.ContainerStatuses {
			st := &p.Status.ContainerStatuses[i]
			st.Ready, st.Started = false, ptr.To(false)
			st.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: int32(code), Reason: reason,
				Message: string(msg), StartedAt: now, FinishedAt: now, ContainerID: st.ContainerID}}
		}
		for i := range p.Status.Conditions {
			if c := &p.Status.Conditions[i]; c.Type == corev1.PodReady || c.Type == corev1.ContainersReady {
				c.Status, c.LastTransitionTime = corev1.ConditionFalse, now
			}
		}
	})
}

// claimDir is the directory of the volume claim name is bound to.
func (s *Standin) claimDir(ctx context.Context, namespace, name string) (string, error) {
	c, err := s.Clients.Kube.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	pv, err := s.Clients.Kube.CoreV1().PersistentVolumes().Get(ctx, c.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("claim %s/%s: %w", namespace, name, err)
	}
	switch {
	case pv.Spec.HostPath != nil:
		return pv.Spec.HostPath.Path, nil
	case pv.Spec.Local != nil:
		return pv.Spec.Local.Path, nil
	case pv.Spec.CSI != nil && pv.Spec.CSI.Driver == Driver:
		return s.VolumeDir(pv.Spec.CSI.VolumeHandle), nil
	}
	return "", fmt.Errorf("volume %s of claim %s/%s is neither local nor Longhorn's", pv.Name, namespace, name)
}

// attach marks the Longhorn volumes of pod p's claims attached to the node, as Longhorn reports
// a volume a starting pod mounts.
func (s *Standin) attach(ctx context.Context, p *corev1.Pod) error {
	var errs []error
	for _, v := range p.Spec.Volumes {
		if v.PersistentVolumeClaim == nil {
			continue
		}
		c, err := s.Clients.Kube.CoreV1().PersistentVolumeClaims(p.Namespace).Get(ctx, v.PersistentVolumeClaim.ClaimName, metav1.GetOptions{})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, s.setVolume(ctx, c.Spec.VolumeName, func(st *longhornv1beta2.VolumeStatus) {
			st.State, st.CurrentNodeID = longhornv1beta2.VolumeStateAttached, s.Node
		}))
	}
	return errors.Join(errs...)
}

// setVolume changes the status of Longhorn volume name, when there is one, retried on conflicts.
func (s *Standin) setVolume(ctx context.Context, name string, change func(*longhornv1beta2.VolumeStatus)) error {
	lh := s.Clients.Longhorn.LonghornV1beta2().Volumes(longhorn.Namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		v, err := lh.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(&v.Status)
		_, err = lh.UpdateStatus(ctx, v, metav1.UpdateOptions{})
		return err
	})
	if apierrors.IsNotFound(err) {
		return nil // not a Longhorn volume
	}
	return err
}

// attachments detaches each Longhorn volume no unfinished pod uses any more (a pod gone, or
// ended), and records which claim holds it and, as Longhorn's PV controller does, every pod of
// that claim (the last list kept once none is left). Attaching is the kubelet's part (attach),
// when a pod starts.
func (s *Standin) attachments(ctx context.Context) error {
	lh := s.Clients.Longhorn.LonghornV1beta2().Volumes(longhorn.Namespace)
	vols, err := lh.List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	pods, err := s.Clients.Kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	pvList, err := s.Clients.Kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	pvs := map[string]*corev1.PersistentVolume{}
	for i := range pvList.Items {
		pvs[pvList.Items[i].Name] = &pvList.Items[i]
	}
	var errs []error
	for i := range vols.Items {
		v := &vols.Items[i]
		pv := pvs[v.Name]
		if pv == nil {
			continue
		}
		used := false
		var workloads []longhornv1beta2.WorkloadStatus
		if ref := pv.Spec.ClaimRef; ref != nil && pv.Status.Phase == corev1.VolumeBound {
			for _, p := range pods.Items {
				if p.Namespace != ref.Namespace || !usesClaim(&p, ref.Name) {
					continue
				}
				workloads = append(workloads, longhornv1beta2.WorkloadStatus{PodName: p.Name, PodStatus: string(p.Status.Phase)})
				if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
					used = true
				}
			}
		}
		want := v.Status.DeepCopy()
		if !used {
			want.State, want.CurrentNodeID = longhornv1beta2.VolumeStateDetached, ""
		}
		// Longhorn's PV controller lists every pod of the claim, by name, whatever its phase, and
		// keeps the last list once none is left.
		if len(workloads) > 0 {
			sort.Slice(workloads, func(i, j int) bool { return workloads[i].PodName < workloads[j].PodName })
			want.KubernetesStatus.WorkloadsStatus = workloads
		}
		if ref := pv.Spec.ClaimRef; ref != nil {
			want.KubernetesStatus.PVName, want.KubernetesStatus.Namespace, want.KubernetesStatus.PVCName = pv.Name, ref.Namespace, ref.Name
		}
		if equalStatus(&v.Status, want) {
			continue
		}
		v.Status = *want
		if _, err := lh.UpdateStatus(ctx, v, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func equalStatus(a, b *longhornv1beta2.VolumeStatus) bool {
	return a.State == b.State && a.CurrentNodeID == b.CurrentNodeID && a.KubernetesStatus.PVCName == b.KubernetesStatus.PVCName &&
		slices.Equal(a.KubernetesStatus.WorkloadsStatus, b.KubernetesStatus.WorkloadsStatus)
}

func usesClaim(p *corev1.Pod, claim string) bool {
	for _, v := range p.Spec.Volumes {
		if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == claim {
			return true
		}
	}
	return false
}
