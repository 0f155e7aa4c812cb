// Package moverpod is the kip side of the data mover: the copy, verify and scan pods that run it
// (internal/mover) by the pinned image, the resources the move's room and quota checks
// count for them, and the reading of what a finished pod reported.
package moverpod

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/backup"
	"kipper.run/kip/internal/mover"
	"kipper.run/kip/manifests"
)

// Container is the mover's container name in its pods.
const Container = "mover"

// Label marks a mover pod with its operation.
const Label = "kipper.run/mover"

// Where the pods mount the volumes.
const (
	OriginalPath = "/original"
	CopyPath     = "/copy"
)

// Image is the mover's image by digest (manifests/mover-image.yaml).
func Image() (string, error) {
	pin, err := manifests.MoverImage()
	if err != nil {
		return "", err
	}
	return pin.Reference(), nil
}

// Resources is what a mover pod requests, and its limit. The copy pod's memory is 1 GiB, request
// and limit alike, because the data it has read and not yet written counts against its memory:
// the room and quota checks count that 1 GiB. The verify and scan pods read only.
func Resources(op mover.Op) corev1.ResourceRequirements {
	mem := resource.MustParse("256Mi")
	if op == mover.OpCopy {
		mem = resource.MustParse("1Gi")
	}
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: mem},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: mem},
	}
}

// Spec is one mover pod.
type Spec struct {
	Name, Namespace string
	Op              mover.Op
	// Original and Copy are the volumes: the original is always mounted read-only, the copy
	// read-only but for a copy. A scan has no Copy.
	Original, Copy corev1.VolumeSource
	// Node, when set, is the node the pod runs on.
	Node string
	// Clean lets a copy empty a copy volume that is not empty (a copy made again).
	Clean bool
	// Labels are added to the pod's.
	Labels map[string]string
}

// Pod is the pod for s: the mover as root with every capability dropped but the ones its
// operation needs, a read-only root filesystem, no service account token, never restarted (its
// exit code and termination message are the result), and left out of every backup.
func Pod(s Spec) (*corev1.Pod, error) {
	img, err := Image()
	if err != nil {
		return nil, err
	}
	args := []string{string(s.Op)}
	mounts := []corev1.VolumeMount{{Name: "original", MountPath: OriginalPath, ReadOnly: true}}
	volumes := []corev1.Volume{{Name: "original", VolumeSource: s.Original}}
	switch s.Op {
	case mover.OpCopy, mover.OpVerify:
		if s.Clean && s.Op == mover.OpCopy {
			args = append(args, "--clean")
		}
		args = append(args, OriginalPath, CopyPath)
		mounts = append(mounts, corev1.VolumeMount{Name: "copy", MountPath: CopyPath, ReadOnly: s.Op != mover.OpCopy})
		volumes = append(volumes, corev1.Volume{Name: "copy", VolumeSource: s.Copy})
	case mover.OpScan:
		args = append(args, OriginalPath)
	default:
		return nil, fmt.Errorf("no mover operation %q", s.Op)
	}
	var add []corev1.Capability
	for _, c := range mover.Capabilities(s.Op) {
		add = append(add, corev1.Capability(c))
	}
	labels := map[string]string{Label: string(s.Op)}
	for k, v := range s.Labels {
		labels[k] = v
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace, Labels: labels},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			NodeName:                     s.Node,
			AutomountServiceAccountToken: ptr.To(false),
			EnableServiceLinks:           ptr.To(false),
			Containers: []corev1.Container{{
				Name:                     Container,
				Image:                    img,
				ImagePullPolicy:          corev1.PullNever,
				Args:                     args,
				Resources:                Resources(s.Op),
				VolumeMounts:             mounts,
				TerminationMessagePath:   mover.TerminationLog,
				TerminationMessagePolicy: corev1.TerminationMessageReadFile,
				SecurityContext: &corev1.SecurityContext{
					RunAsUser:                ptr.To[int64](0),
					RunAsGroup:               ptr.To[int64](0),
					RunAsNonRoot:             ptr.To(false),
					Privileged:               ptr.To(false),
					AllowPrivilegeEscalation: ptr.To(false),
					ReadOnlyRootFilesystem:   ptr.To(true),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: add},
					SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
			}},
			Volumes: volumes,
		},
	}
	backup.ExcludeFromBackups(pod)
	return pod, nil
}

// Result is what a finished mover pod reported: its termination message, or, when that was cut
// (it lists fewer differences than the run found), the full report from its log. A pod that ended
// without a report is an error that says how it ended. It returns nil and no error while the pod
// runs.
func Result(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod) (*mover.Report, error) {
	var term *corev1.ContainerStateTerminated
	for _, st := range pod.Status.ContainerStatuses {
		if st.Name == Container {
			term = st.State.Terminated
		}
	}
	if term == nil {
		if pod.Status.Phase == corev1.PodFailed {
			return nil, fmt.Errorf("pod %s/%s failed before its mover ran: %s %s", pod.Namespace, pod.Name, pod.Status.Reason, pod.Status.Message)
		}
		return nil, nil
	}
	rep, err := mover.Decode([]byte(term.Message))
	if err != nil {
		var why []string
		if r, ok := mover.ResultOfExit(int(term.ExitCode)); ok {
			why = append(why, string(r))
		}
		if term.Reason != "" {
			why = append(why, term.Reason)
		}
		how := fmt.Sprintf("exit code %d", term.ExitCode)
		if len(why) > 0 {
			how += " (" + strings.Join(why, ", ") + ")"
		}
		what := "no report"
		if term.Message != "" {
			what = fmt.Sprintf("an unreadable report (%v)", err)
		}
		return nil, fmt.Errorf("pod %s/%s ended with %s and %s: kubectl -n %s logs %s", pod.Namespace, pod.Name, how, what, pod.Namespace, pod.Name)
	}
	if code := rep.Result.ExitCode(); code != int(term.ExitCode) {
		return nil, fmt.Errorf("pod %s/%s reported %s but exited with %d, not %d (kubectl -n %s logs %s)",
			pod.Namespace, pod.Name, rep.Result, term.ExitCode, code, pod.Namespace, pod.Name)
	}
	if !rep.Shortened {
		return rep, nil
	}
	log, err := cs.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: Container}).DoRaw(ctx)
	if err != nil {
		return rep, nil // the termination message still holds the totals and the first differences
	}
	if full, err := mover.FindFull(log, rep.Digest); err == nil {
		return full, nil
	}
	return rep, nil
}
