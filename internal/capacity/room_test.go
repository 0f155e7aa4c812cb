package capacity

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func requests(cpu, mem string) corev1.ResourceList {
	return corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}
}

func roomPod(uid, node, cpu, mem string, edit func(*corev1.Pod)) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: uid, UID: types.UID(uid)}, Spec: corev1.PodSpec{NodeName: node,
		Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: requests(cpu, mem)}}}}}
	if edit != nil {
		edit(&p)
	}
	return p
}

func TestCheckRoom(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "server", Labels: map[string]string{"disk": "ssd"}},
		Spec:   corev1.NodeSpec{Taints: []corev1.Taint{{Key: "dedicated", Value: "db", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{Allocatable: requests("2", "4Gi")}}
	service := roomPod("db-0", "server", "500m", "1Gi", nil)
	pods := []corev1.Pod{
		service,
		roomPod("web", "server", "1", "1Gi", nil),
		// Pending: counted when the scheduler could place it on the node.
		roomPod("fits", "", "200m", "512Mi", func(p *corev1.Pod) {
			p.Spec.NodeSelector = map[string]string{"disk": "ssd"}
			p.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}
		}),
		roomPod("other-disk", "", "1", "1Gi", func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"disk": "hdd"} }),
		roomPod("untolerated", "", "1", "1Gi", nil),
		roomPod("other-node", "worker", "1", "1Gi", nil),
		roomPod("done", "server", "1", "1Gi", func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }),
	}
	copyPod := Need{"the copy pod", requests("100m", "1Gi")}
	verifyPod := Need{"the verify pod", requests("100m", "256Mi")}
	svc := Need{"the service", requests("500m", "1Gi")}
	// Free once db-0 is gone: 2000m - 1000m - 200m = 800m; 4096 - 1024 - 512 = 2560 MiB.
	if err := CheckRoom(node, pods, []corev1.Pod{service}, copyPod, verifyPod, svc); err != nil {
		t.Errorf("CheckRoom refuses with room to spare: %v", err)
	}
	if err := CheckRoom(node, pods, []corev1.Pod{service}, Need{"the service", requests("900m", "1Gi")}); err == nil ||
		!strings.Contains(err.Error(), "node server has 800m of cpu free") || !strings.Contains(err.Error(), "the service needs 900m") {
		t.Errorf("CheckRoom for 900m of CPU: %v", err)
	}
	// With db-0 still counted, 1536 MiB are free.
	if err := CheckRoom(node, pods, nil, Need{"the copy pod", requests("100m", "2560Mi")}); err == nil ||
		!strings.Contains(err.Error(), "node server has 1536 MiB of memory free") || !strings.Contains(err.Error(), "the copy pod needs 2560 MiB") {
		t.Errorf("CheckRoom with the service's pod counted: %v", err)
	}
}
