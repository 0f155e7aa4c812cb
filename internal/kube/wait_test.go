package kube_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/test/testenv"
)

func podTemplate(app string, nodeSelector map[string]string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": app}, Annotations: testenv.FastPodAnnotations()},
		Spec: corev1.PodSpec{
			NodeSelector: nodeSelector,
			Containers:   []corev1.Container{{Name: app, Image: "registry.invalid/" + app + ":1"}},
		},
	}
}

// kwokNode adds a fake Node for the test and returns a node selector that pins Pods to it.
func kwokNode(t *testing.T, env *testenv.Env, ns string) map[string]string {
	t.Helper()
	env.AddNode(t, "node-"+ns, testenv.NodeOptions{Labels: map[string]string{"kip-test": ns}})
	return map[string]string{"kip-test": ns}
}

func TestWaitRolloutDeployment(t *testing.T) {
	t.Parallel()
	c, env := clients(t)
	ns := env.Namespace(t)
	sel := kwokNode(t, env, ns)
	ctx := context.Background()
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "console-api", Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "console-api"}},
			Template: podTemplate("console-api", sel),
		},
	}
	if _, err := c.Kube.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := kube.WaitRollout(ctx, c, "Deployment", ns, "console-api", time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("rolled out in %s", time.Since(began).Round(time.Millisecond))

	// A new template rolls out again; the wait covers the replacement of the old replicas.
	// The Deployment controller writes the Deployment too (its status): the change is made on the
	// latest one, again on a conflict.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d, err := c.Kube.AppsV1().Deployments(ns).Get(ctx, "console-api", metav1.GetOptions{})
		if err != nil {
			return err
		}
		d.Spec.Template.Spec.Containers[0].Image = "registry.invalid/console-api:2"
		_, err = c.Kube.AppsV1().Deployments(ns).Update(ctx, d, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := kube.WaitRollout(ctx, c, "deployment", ns, "console-api", time.Minute); err != nil {
		t.Fatal(err)
	}
	got, err := c.Kube.AppsV1().Deployments(ns).Get(ctx, "console-api", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st := got.Status; st.UpdatedReplicas != 2 || st.AvailableReplicas != 2 || st.Replicas != 2 || st.ObservedGeneration != got.Generation {
		t.Errorf("after the wait: %+v", st)
	}
}

func TestWaitRolloutTimesOutNamingWhatIsPending(t *testing.T) {
	t.Parallel()
	c, env := clients(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "stuck", Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "stuck"}},
			// No node has this label: the Pods stay Pending.
			Template: podTemplate("stuck", map[string]string{"kip-test": "no-such-node"}),
		},
	}
	if _, err := c.Kube.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err := kube.WaitRollout(ctx, c, "Deployment", ns, "stuck", 3*time.Second)
	want := regexp.MustCompile(`^timed out after 3s waiting for rollout: Deployment ` + ns + `/stuck (has [0-2] of 2 replicas updated, 0 available|: spec update not yet observed .*)$`)
	if err == nil || !want.MatchString(err.Error()) {
		t.Fatalf("err = %v, want %s", err, want)
	}
	t.Logf("%v", err)

	// The caller's context ends the wait early and says so.
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	err = kube.WaitRollout(cctx, c, "Deployment", ns, "stuck", time.Hour)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "Deployment "+ns+"/stuck has") {
		t.Errorf("cancelled wait: %v", err)
	}

	err = kube.WaitRollout(ctx, c, "Deployment", ns, "absent", time.Second)
	if err == nil || err.Error() != "timed out after 1s waiting for rollout: Deployment "+ns+"/absent not found" {
		t.Errorf("absent: %v", err)
	}
	if err := kube.WaitRollout(ctx, c, "Job", ns, "x", time.Second); err == nil || !strings.Contains(err.Error(), "only a Deployment, DaemonSet or StatefulSet rolls out") {
		t.Errorf("Job: %v", err)
	}
}

func TestWaitRolloutDaemonSetAndStatefulSet(t *testing.T) {
	t.Parallel()
	c, env := clients(t)
	ns := env.Namespace(t)
	sel := kwokNode(t, env, ns)
	ctx := context.Background()
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "agent", Namespace: ns},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "agent"}},
			Template: podTemplate("agent", sel),
		},
	}
	if _, err := c.Kube.AppsV1().DaemonSets(ns).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: ns},
		Spec: appsv1.StatefulSetSpec{
			Replicas:    ptr.To[int32](2),
			ServiceName: "db",
			Selector:    &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
			Template:    podTemplate("db", sel),
		},
	}
	if _, err := c.Kube.AppsV1().StatefulSets(ns).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.WaitRollout(ctx, c, "DaemonSet", ns, "agent", time.Minute); err != nil {
		t.Fatal(err)
	}
	got, err := c.Kube.AppsV1().DaemonSets(ns).Get(ctx, "agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.DesiredNumberScheduled != 1 || got.Status.NumberAvailable != 1 {
		t.Errorf("daemonset status after the wait: %+v", got.Status)
	}
	if err := kube.WaitRollout(ctx, c, "StatefulSet", ns, "db", time.Minute); err != nil {
		t.Fatal(err)
	}
	gotSts, err := c.Kube.AppsV1().StatefulSets(ns).Get(ctx, "db", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if gotSts.Status.ReadyReplicas != 2 {
		t.Errorf("statefulset status after the wait: %+v", gotSts.Status)
	}
}

func TestWaitCRDsEstablished(t *testing.T) {
	c, _ := clients(t)
	ctx := context.Background()
	if err := kube.WaitCRDsEstablished(ctx, c, []string{"volumes.longhorn.io", "backups.velero.io"}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	err := kube.WaitCRDsEstablished(ctx, c, []string{"volumes.longhorn.io", "gadgets.nothing.example.com"}, time.Second)
	if err == nil || err.Error() != "timed out after 1s waiting for CRDs to be established: CRD gadgets.nothing.example.com not found" {
		t.Errorf("err = %v", err)
	}
	if err := kube.WaitCRDsEstablished(ctx, c, nil, time.Second); err != nil {
		t.Errorf("no names: %v", err)
	}
}

func TestWaitNodesReady(t *testing.T) {
	t.Parallel()
	c, env := clients(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	// kwok makes this one Ready.
	ready := "ready-" + ns
	env.AddNode(t, ready, testenv.NodeOptions{})
	// Nothing manages this one: it never reports Ready.
	silent := "silent-" + ns
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: silent},
		Status: corev1.NodeStatus{Capacity: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("1"),
		}},
	}
	if _, err := c.Kube.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Kube.CoreV1().Nodes().Delete(context.Background(), silent, metav1.DeleteOptions{}) })

	if err := kube.WaitNodesReady(ctx, c, []string{ready}, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	err := kube.WaitNodesReady(ctx, c, []string{ready, silent, "gone-" + ns}, 2*time.Second)
	// The node lifecycle controller marks the silent Node Ready=Unknown once its grace period ends.
	want := regexp.MustCompile(fmt.Sprintf(`^timed out after 2s waiting for nodes to be Ready: node gone-%s not found, node %s (has not reported Ready yet|Ready unknown \(NodeStatusNeverUpdated: .*\))$`, ns, silent))
	if err == nil || !want.MatchString(err.Error()) {
		t.Errorf("err = %v\nwant %s", err, want)
	}
}
