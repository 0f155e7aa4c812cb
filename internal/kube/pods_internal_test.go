package kube

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestPodProblem: the reasons that waiting does not cure are reported with the kubelet's message
// and how the container last ended; a first pull failure, a container being created and a
// running one are not problems.
func TestPodProblem(t *testing.T) {
	waiting := func(reason, msg string) corev1.ContainerState {
		return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}
	}
	for _, tt := range []struct {
		name string
		pod  corev1.Pod
		want string
	}{
		{"running", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{
			{Name: "api", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}}, ""},
		{"creating", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{
			{Name: "api", State: waiting("ContainerCreating", "")}}}}, ""},
		{"first pull failure", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{
			{Name: "api", State: waiting("ErrImagePull", "not found")}}}}, ""},
		{"pull backing off", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{
			{Name: "api", State: waiting("ImagePullBackOff", `Back-off pulling image "x:latest"`)}}}},
			`container api is in ImagePullBackOff (Back-off pulling image "x:latest")`},
		{"crash loop", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{
			{Name: "api", State: waiting("CrashLoopBackOff", "back-off 10s restarting failed container=api"),
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", Message: "read-only file system\n"}}}}}},
			"container api is in CrashLoopBackOff (back-off 10s restarting failed container=api); it last exited with code 1 (Error): read-only file system"},
		{"init container", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending, InitContainerStatuses: []corev1.ContainerStatus{
			{Name: "init", State: waiting("CreateContainerConfigError", `secret "s" not found`)}}}},
			`container init is in CreateContainerConfigError (secret "s" not found)`},
		{"failed", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "low on memory"}}, "it failed: Evicted low on memory"},
	} {
		if got := PodProblem(&tt.pod); got != tt.want {
			t.Errorf("%s: PodProblem = %q, want %q", tt.name, got, tt.want)
		}
	}
}
