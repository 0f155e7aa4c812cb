package longhorn

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// cpuPod is a pod on node (none: pending, with no selector or toleration) requesting cpu.
func cpuPod(name, node, cpu string) corev1.Pod {
	return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(name)}, Spec: corev1.PodSpec{NodeName: node,
		Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}}}}}}
}

func TestCheckCPU(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "server"}, Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}}}
	if got := CPU(node); got != 240 {
		t.Fatalf("CPU on 2 CPUs = %dm, want 240m (the spec's figure)", got)
	}
	db := ServiceCPU{Name: "db", Namespace: "shop-staging", Project: "shop", Environment: "staging", Request: resource.MustParse("500m")}
	cache := ServiceCPU{Name: "cache", Namespace: "shop-prod", Project: "shop", Environment: "prod", Request: resource.MustParse("100m")}
	pods := func(cpus ...string) []corev1.Pod {
		var out []corev1.Pod
		for i, c := range cpus {
			out = append(out, cpuPod(string(rune('a'+i)), "server", c))
		}
		return out
	}
	// 2000m - 1655m = 345m free: room for 240m.
	if err := CheckCPU(node, pods("500m", "1155m"), []ServiceCPU{db}); err != nil {
		t.Errorf("345m free: %v", err)
	}
	// 2000m - 1855m = 145m free, 95m short: the spec's own example.
	err := CheckCPU(node, pods("500m", "1355m"), []ServiceCPU{cache, db})
	want := "Lower db in shop-staging from 500m to 405m with 'kip service update db --cpu 405m --project shop --environment staging', or give the node more CPU"
	if err == nil || !strings.HasSuffix(err.Error(), want) || !strings.Contains(err.Error(), "node server has 145m of CPU free") {
		t.Errorf("95m short: %v\nwant it to end %q", err, want)
	}
	// 580m short: db gives 490m, cache the other 90m.
	err = CheckCPU(node, pods("500m", "100m", "1740m"), []ServiceCPU{cache, db})
	want = "Lower db in shop-staging from 500m to 10m with 'kip service update db --cpu 10m --project shop --environment staging', " +
		"and Lower cache in shop-prod from 100m to 10m with 'kip service update cache --cpu 10m --project shop --environment prod', or give the node more CPU"
	if err == nil || !strings.HasSuffix(err.Error(), want) {
		t.Errorf("580m short: %v\nwant it to end %q", err, want)
	}
	// More short than the services can give: no suggestion.
	err = CheckCPU(node, pods("500m", "1900m"), []ServiceCPU{db})
	if err == nil || !strings.HasSuffix(err.Error(), "give the node more CPU, or lower the CPU requests of the pods on it") {
		t.Errorf("too short for a suggestion: %v", err)
	}
	// A pending pod that could land on the node counts; one on another node does not.
	pending := cpuPod("p", "", "200m")
	other := cpuPod("o", "worker", "1")
	if err := CheckCPU(node, append(pods("1600m"), other), nil); err != nil {
		t.Errorf("another node's pod counted: %v", err)
	}
	if err := CheckCPU(node, append(pods("1600m"), pending), nil); err == nil {
		t.Error("a pending pod that could run on the node was not counted")
	}
}
