package upgrade

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/test/testenv"
)

// TestUnmountedVolumes: before a Longhorn step's backup, every claim of every project's
// namespaces must be mounted by a regular container of a running pod (Velero's file backup reads
// it there). Against a real API server: a claim a running pod's container mounts passes; one a
// stopped app's Deployment names asks for kip app start; a stopped service's and a fenced
// service's ask for kip service start; one mounted only by an init container, or by a pod that
// is not running, asks to mount it or remove it.
func TestUnmountedVolumes(t *testing.T) {
	env := testenv.Get(t)
	cl, err := kube.NewClients(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := projectNamespace(t, cl, "mnt", "prod")
	project := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Project",
		"metadata": map[string]any{"name": "mnt"}, "spec": map[string]any{"environments": []any{map[string]any{"name": "prod"}}}}}
	created, err := cl.Dynamic.Resource(service.ProjectsGVR).Create(ctx, project, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cl.Dynamic.Resource(service.ProjectsGVR).Delete(context.Background(), "mnt", metav1.DeleteOptions{})
	})
	if err := unstructured.SetNestedStringSlice(created.Object, []string{ns}, "status", "namespaces"); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Dynamic.Resource(service.ProjectsGVR).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, claim := range []string{"logs", "uploads", "data-db-0", "data-cache-0", "scratch", "pending"} {
		c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: claim, Namespace: ns}, Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
		if _, err := cl.Kube.CoreV1().PersistentVolumeClaims(ns).Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The pods' node: a Node object no kubelet keeps, so that the pods keep the phase the test
	// gives them (and the pod garbage collector keeps pods whose node exists).
	node := "mnt-node-" + ns
	if _, err := cl.Kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Kube.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	pod := func(name, claim string, init bool, phase corev1.PodPhase) {
		t.Helper()
		c := corev1.Container{Name: "c", Image: "busybox", VolumeMounts: []corev1.VolumeMount{{Name: "v", MountPath: "/v"}}}
		spec := corev1.PodSpec{NodeName: node, Volumes: []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}}
		if init {
			spec.InitContainers = []corev1.Container{c}
			spec.Containers = []corev1.Container{{Name: "main", Image: "busybox"}}
		} else {
			spec.Containers = []corev1.Container{c}
		}
		p, err := cl.Kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: spec}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// No kubelet runs on the node: deleted at once, before the namespace's cleanup waits for it.
		t.Cleanup(func() {
			_ = cl.Kube.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		})
		p.Status.Phase = phase
		if _, err := cl.Kube.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod("writer", "logs", false, corev1.PodRunning)
	pod("setup", "scratch", true, corev1.PodRunning)
	pod("waiting", "pending", false, corev1.PodPending)
	addApp(t, cl, ns, "web", map[string]any{"image": "registry.example/web:1", "stop": map[string]any{"reason": "stopped by its owner"}}, 0)
	// A merge patch: the Deployment controller writes the Deployment meanwhile.
	volumes := `{"spec":{"template":{"spec":{"volumes":[{"name":"uploads","persistentVolumeClaim":{"claimName":"uploads"}}]}}}}`
	if _, err := cl.Kube.AppsV1().Deployments(ns).Patch(ctx, "web", types.MergePatchType, []byte(volumes), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, annotations := range map[string]map[string]any{"db": {service.FenceAnnotation: "lab12"}, "cache": nil} {
		s := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Service",
			"metadata": map[string]any{"name": name, "namespace": ns, "annotations": annotations},
			"spec":     map[string]any{"type": "postgres", "storage": "1Gi", "stopped": true}}}
		if _, err := cl.Dynamic.Resource(service.ServicesGVR).Namespace(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	got, err := unmountedVolumes(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(got, "\n")
	for _, want := range []string{
		"volume data-cache-0 in mnt-prod is mounted by no running pod, so a backup would not hold its data: service cache is stopped: start it with 'kip service start cache --project mnt --environment prod', or remove the volume",
		"volume data-db-0 in mnt-prod is mounted by no running pod, so a backup would not hold its data: kip node fence stopped service db (worker lab12): start it with 'kip service start db --project mnt --environment prod', or remove the volume",
		"volume uploads in mnt-prod is mounted by no running pod, so a backup would not hold its data: app web is stopped: start it with 'kip app start web --project mnt --environment prod', or remove the volume",
		"volume scratch in mnt-prod is mounted by no running pod, so a backup would not hold its data: mount it in a running pod, or remove it",
		"volume pending in mnt-prod is mounted by no running pod",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("no %q in:\n%s", want, all)
		}
	}
	if strings.Contains(all, "volume logs ") {
		t.Errorf("the mounted claim is named:\n%s", all)
	}
}
