package e2e_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/platform"
	"kipper.run/kip/test/e2e"
	"kipper.run/kip/test/lab"
)

// platformPaths runs, on the installed nano cluster: kip platform versions; Loki on and off with
// Prometheus on, Grafana's Loki data source following; the refusal to turn Loki on without room
// for it; and a re-run with --firewall=false that leaves the firewall alone.
func platformPaths(ctx context.Context, t *testing.T, s *e2e.Suite, home string, h *lab.Host, c *kube.Clients) {
	t.Helper()
	r := s.Kip(t, home, "platform", "versions", "-o", "json")
	var v platform.VersionsReport
	if r.ExitCode != 0 || json.Unmarshal([]byte(r.Stdout), &v) != nil {
		t.Fatalf("platform versions: exit %d\n%s\n%s", r.ExitCode, r.Stdout, r.Stderr)
	}
	if v.Kip.Recorded == "" || v.Kip.Recorded != v.Kip.Running || len(v.Nodes) != 1 || v.Nodes[0].Kubernetes != "v1.37.2+k3s1" || len(v.Workloads) == 0 || len(v.Charts) == 0 {
		t.Errorf("platform versions on the lab cluster: %+v", v)
	}
	if r = s.Kip(t, home, "platform", "versions"); r.ExitCode != 0 || !strings.Contains(r.Stdout, "v1.37.2+k3s1") {
		t.Errorf("platform versions (text): exit %d\n%s", r.ExitCode, r.Stdout)
	}

	helmCharts := schema.GroupVersionResource{Group: "helm.cattle.io", Version: "v1", Resource: "helmcharts"}
	grafanaHasLoki := func() bool {
		t.Helper()
		ch, err := c.Dynamic.Resource(helmCharts).Namespace("kube-system").Get(ctx, "prometheus", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		values, _, _ := unstructured.NestedString(ch.Object, "spec", "valuesContent")
		return strings.Contains(values, "http://loki.loki.svc:3100")
	}
	kip := func(args ...string) {
		t.Helper()
		if r := s.Kip(t, home, args...); r.ExitCode != 0 {
			t.Fatalf("kip %s: exit %d\n%s", strings.Join(args, " "), r.ExitCode, r.Stderr)
		}
	}
	kip("platform", "enable", "prometheus")
	if grafanaHasLoki() {
		t.Error("Grafana lists Loki before Loki is on")
	}
	kip("platform", "enable", "loki")
	if rec, _, err := cluster.ReadRecord(ctx, c.Dynamic); err != nil || !rec.Monitoring.Loki || !rec.Monitoring.Prometheus {
		t.Errorf("record after enable loki: %+v %v", rec.Monitoring, err)
	}
	if !grafanaHasLoki() {
		t.Error("Loki turned on, but Grafana's data sources lack it")
	}
	kip("platform", "disable", "loki", "--yes")
	if grafanaHasLoki() {
		t.Error("Loki turned off, but Grafana still lists it")
	}
	kip("platform", "disable", "prometheus", "--yes")

	// No room: a pod on the server asks for all but 300 MiB of its allocatable memory.
	nodes, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) != 1 {
		t.Fatalf("nodes: %v", err)
	}
	node := nodes.Items[0]
	pods, err := c.Kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node.Name})
	if err != nil {
		t.Fatal(err)
	}
	ask := node.Status.Allocatable.Memory().DeepCopy()
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			for _, ct := range p.Spec.Containers {
				ask.Sub(*ct.Resources.Requests.Memory())
			}
		}
	}
	ask.Sub(resource.MustParse("300Mi"))
	hog := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "memory-hog", Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: node.Name, Containers: []corev1.Container{{
			Name: "hog", Image: "registry.example/hog:1",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: ask}},
		}}},
	}
	if _, err := c.Kube.CoreV1().Pods("default").Create(ctx, hog, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r = s.Kip(t, home, "platform", "enable", "loki")
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "loki needs about 600Mi of memory and the server") {
		t.Errorf("enable loki without room: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if err := c.Kube.CoreV1().Pods("default").Delete(ctx, "memory-hog", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	if rec, _, err := cluster.ReadRecord(ctx, c.Dynamic); err != nil || rec.Monitoring.Loki {
		t.Errorf("record after the refused enable: %+v %v", rec.Monitoring, err)
	}

	// --firewall=false: the re-run leaves the host firewall as it is.
	before, err := h.Run(ctx, "ufw status numbered")
	if err != nil {
		t.Fatal(err)
	}
	r = s.Kip(t, home, installArgs(s, h, s.Bundle, "--firewall=false")...)
	// No firewall step at all, not even "Host firewall already set up".
	if r.ExitCode != 0 || strings.Contains(strings.ToLower(r.Stderr), "host firewall") {
		t.Fatalf("re-run with --firewall=false: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if after, err := h.Run(ctx, "ufw status numbered"); err != nil || after != before {
		t.Errorf("ufw after --firewall=false:\n%s\nbefore:\n%s", after, before)
	}
}
