package moverpod_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"kipper.run/kip/internal/backup"
	"kipper.run/kip/internal/mover"
	"kipper.run/kip/internal/mover/moverpod"
	"kipper.run/kip/manifests"
)

func claim(name string) corev1.VolumeSource {
	return corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name}}
}

func TestPods(t *testing.T) {
	pin, err := manifests.MoverImage()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		op       mover.Op
		args     []string
		copyRO   bool
		caps     []string
		memory   string
		hasCopy  bool
		clean    bool
		wantArgs string
	}{
		{op: mover.OpCopy, clean: true, hasCopy: true, memory: "1Gi", wantArgs: "copy --clean /original /copy",
			caps: []string{"CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "MKNOD", "SETFCAP"}},
		{op: mover.OpVerify, copyRO: true, hasCopy: true, memory: "256Mi", wantArgs: "verify /original /copy", caps: []string{"DAC_READ_SEARCH"}},
		{op: mover.OpScan, memory: "256Mi", wantArgs: "scan /original", caps: []string{"DAC_READ_SEARCH"}},
	} {
		t.Run(string(tc.op), func(t *testing.T) {
			pod, err := moverpod.Pod(moverpod.Spec{Name: "m", Namespace: "shop-prod", Op: tc.op, Original: claim("data"), Copy: claim("data-longhorn"), Clean: tc.clean})
			if err != nil {
				t.Fatal(err)
			}
			c := pod.Spec.Containers[0]
			if c.Image != pin.Reference() || !strings.Contains(c.Image, "@sha256:") {
				t.Errorf("image %s, want the pinned %s", c.Image, pin.Reference())
			}
			if got := strings.Join(c.Args, " "); got != tc.wantArgs {
				t.Errorf("args %q, want %q", got, tc.wantArgs)
			}
			sc := c.SecurityContext
			var added []string
			for _, a := range sc.Capabilities.Add {
				added = append(added, string(a))
			}
			if !slices.Equal(added, tc.caps) || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
				*sc.RunAsUser != 0 || *sc.Privileged || *sc.AllowPrivilegeEscalation || !*sc.ReadOnlyRootFilesystem {
				t.Errorf("security context %+v, capabilities %+v", sc, sc.Capabilities)
			}
			if m := c.Resources.Limits.Memory(); m.String() != tc.memory || !m.Equal(*c.Resources.Requests.Memory()) {
				t.Errorf("memory request %s, limit %s, want %s both", c.Resources.Requests.Memory(), m, tc.memory)
			}
			if pod.Spec.RestartPolicy != corev1.RestartPolicyNever || !backup.Excluded(pod) || *pod.Spec.AutomountServiceAccountToken {
				t.Errorf("pod %+v: not a one-shot pod left out of backups", pod.Spec)
			}
			if len(c.VolumeMounts) != len(pod.Spec.Volumes) || !c.VolumeMounts[0].ReadOnly ||
				tc.hasCopy && (len(c.VolumeMounts) != 2 || c.VolumeMounts[1].ReadOnly != tc.copyRO) || !tc.hasCopy && len(c.VolumeMounts) != 1 {
				t.Errorf("mounts %+v", c.VolumeMounts)
			}
		})
	}
	if _, err := moverpod.Pod(moverpod.Spec{Op: "move"}); err == nil {
		t.Error("a pod for an unknown operation")
	}
}

func finished(code int32, msg string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "copy-db", Namespace: "shop-prod"},
		Status: corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{
			Name: moverpod.Container, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Message: msg, Reason: "Error"}},
		}}}}
}

func TestResult(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset()
	rep := &mover.Report{Format: mover.ReportFormat, Op: mover.OpCopy, Result: mover.OutOfSpace, Error: "write /copy/db: no space left on device"}
	got, err := moverpod.Result(ctx, cs, finished(mover.ExitOutOfSpace, string(rep.Termination(rep.Line()))))
	if err != nil || got.Result != mover.OutOfSpace || got.Error != rep.Error {
		t.Errorf("Result = %+v, %v; want the out-of-space report", got, err)
	}
	for _, tc := range []struct {
		pod  *corev1.Pod
		want string
	}{
		{finished(137, ""), "ended with exit code 137 (Error) and no report"},
		{finished(mover.ExitError, ""), "exit code 1 (error, Error) and no report"},
		{finished(mover.ExitError, "{"), "and an unreadable report"},
		{finished(mover.ExitDone, string(rep.Termination(rep.Line()))), "reported out-of-space but exited with 0, not 4"},
		{&corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted"}}, "failed before its mover ran: Evicted"},
	} {
		if got, err := moverpod.Result(ctx, cs, tc.pod); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Result = %+v, %v; want an error saying %q", got, err, tc.want)
		}
	}
	if got, err := moverpod.Result(ctx, cs, &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning}}); got != nil || err != nil {
		t.Errorf("a running pod: %+v, %v; want nothing yet", got, err)
	}
}
