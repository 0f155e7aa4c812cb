package testenv

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclientset "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"kipper.run/kip/test/controlplane"
	"kipper.run/kip/test/need"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

func TestLoadCRDsFromModules(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	sources, err := crdSources(root)
	if err != nil {
		t.Fatal(err)
	}
	crds, err := loadCRDs(sources)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, c := range crds {
		names[c.Name] = true
		if len(c.Labels) > 0 && c.Labels["longhorn-manager"] != "" {
			t.Errorf("%s: unexpected labels %v", c.Name, c.Labels)
		}
	}
	for _, want := range []string{"volumes.longhorn.io", "engineimages.longhorn.io", "nodes.longhorn.io", "backups.velero.io", "restores.velero.io", "backupstoragelocations.velero.io", "datauploads.velero.io"} {
		if !names[want] {
			t.Errorf("CRD %s not loaded", want)
		}
	}
	if len(crds) < 30 {
		t.Errorf("loaded %d CRDs, want Longhorn's 22 and Velero's 13 at least", len(crds))
	}
}

func TestDecodeCRDsRejectsOtherKinds(t *testing.T) {
	_, err := decodeCRDs([]byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n"))
	if err == nil || !strings.Contains(err.Error(), "document 1: v1 ConfigMap is not a CustomResourceDefinition") {
		t.Fatalf("err = %v", err)
	}
}

func TestNamespaceName(t *testing.T) {
	valid := regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	for _, name := range []string{"TestX", "TestApply/re-apply_is_a_no-op", strings.Repeat("TestVeryLong", 10), "///"} {
		got := namespaceName(name)
		if len(got) > 63 || !valid.MatchString(got) {
			t.Errorf("namespaceName(%q) = %q: not a DNS label", name, got)
		}
	}
	if a, b := namespaceName("TestX"), namespaceName("TestX"); a == b {
		t.Errorf("two namespaces for one test share the name %s", a)
	}
}

func TestKwokStagesComplete(t *testing.T) {
	bin, err := BinDir()
	if err != nil {
		t.Fatal(err)
	}
	data, note, err := kwokStages(bin)
	if err != nil {
		need.Missing(t, "%v", err)
	}
	if note != "" {
		t.Logf("%s", note)
	}
	for _, s := range requiredStages {
		if !strings.Contains(string(data), "name: "+s+"\n") {
			t.Errorf("stage %s missing from kwok's configuration", s)
		}
	}
}

// TestStartAndStop starts an environment of its own, checks what Start promises, stops it and
// checks that no process survived.
func TestStartAndStop(t *testing.T) {
	e := Start(t)
	t.Logf("environment started in %s (%s)", e.StartupTime.Round(time.Millisecond), e.Timings)
	ctx := context.Background()

	fi, err := os.Stat(e.KubeconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("kubeconfig mode %v, want 0600", fi.Mode().Perm())
	}
	// The kubeconfig file is an ordinary one: load it as kubectl would.
	cfg, err := clientcmd.BuildConfigFromFlags("", e.KubeconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.CAData) == 0 || len(cfg.CertData) == 0 || len(cfg.KeyData) == 0 {
		t.Errorf("kubeconfig lacks the cluster CA or client credentials")
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	v, err := kube.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != "v1.37.2" {
		t.Errorf("server version %s, want v1.37.2", v.GitVersion)
	}
	// Admin is system:masters.
	review, err := kube.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(review.Status.UserInfo.Groups, "system:masters") {
		t.Errorf("kubeconfig user %s in groups %v, want system:masters", review.Status.UserInfo.Username, review.Status.UserInfo.Groups)
	}
	// The service CIDR is k3s's.
	svc, err := kube.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.ClusterIP != "10.43.0.1" {
		t.Errorf("kubernetes service IP %s, want 10.43.0.1", svc.Spec.ClusterIP)
	}
	ext := apiextensionsclientset.NewForConfigOrDie(cfg)
	for _, name := range []string{"volumes.longhorn.io", "backups.velero.io"} {
		crd, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !crdEstablished(crd) {
			t.Errorf("CRD %s not Established", name)
		}
	}

	pids := e.pids()
	for _, name := range controlPlaneBinaries {
		if pids[name] == 0 {
			t.Errorf("no %s process", name)
		}
	}
	dir := e.Dir
	e.Stop()
	for name, pid := range pids {
		if controlplane.GroupAlive(pid) {
			t.Errorf("%s (pid %d) still running after Stop", name, pid)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("environment directory %s not removed: %v", dir, err)
	}
}

func crdEstablished(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established {
			return c.Status == apiextensionsv1.ConditionTrue
		}
	}
	return false
}

// TestDeploymentRunsOnKwokNode proves scheduler, controller-manager and kwok together: a
// Deployment's Pods are created, scheduled onto a fake Node and reach Running.
func TestDeploymentRunsOnKwokNode(t *testing.T) {
	t.Parallel()
	e := Get(t)
	ns := e.Namespace(t)
	node := e.AddNode(t, "kwok-"+ns, NodeOptions{CPU: "2", Memory: "4Gi", Labels: map[string]string{"test": ns}})
	if got := node.Status.Allocatable.Cpu().String(); got != "2" {
		t.Errorf("node allocatable cpu %s, want 2", got)
	}
	ctx := context.Background()
	dep := testDeployment(ns, "web", 2, map[string]string{"test": ns})
	if _, err := e.Kube.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pods *corev1.PodList
	waitFor(t, time.Minute, "2 Running pods on "+node.Name, func() (bool, string) {
		var err error
		pods, err = e.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return false, err.Error()
		}
		running := 0
		var states []string
		for _, p := range pods.Items {
			states = append(states, fmt.Sprintf("%s %s on %q", p.Name, p.Status.Phase, p.Spec.NodeName))
			if p.Status.Phase == corev1.PodRunning && p.Spec.NodeName == node.Name && p.Status.PodIP != "" {
				running++
			}
		}
		return running == 2, strings.Join(states, ", ")
	})
	waitFor(t, time.Minute, "deployment available", func() (bool, string) {
		d, err := e.Kube.AppsV1().Deployments(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return d.Status.AvailableReplicas == 2, fmt.Sprintf("%d available", d.Status.AvailableReplicas)
	})
	for _, p := range pods.Items {
		t.Logf("pod %s on %s, IP %s", p.Name, p.Spec.NodeName, p.Status.PodIP)
	}
}

// TestNamespaceDeletionFinishes proves the namespace controller and kwok together: a namespace
// holding running Pods and other objects really goes away.
func TestNamespaceDeletionFinishes(t *testing.T) {
	t.Parallel()
	e := Get(t)
	ns := e.Namespace(t)
	node := e.AddNode(t, "kwok-"+ns, NodeOptions{Labels: map[string]string{"test": ns}})
	ctx := context.Background()
	if _, err := e.Kube.AppsV1().Deployments(ns).Create(ctx, testDeployment(ns, "app", 3, map[string]string{"test": ns}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings", Namespace: ns}, Data: map[string]string{"a": "b"}}
	if _, err := e.Kube.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "3 Running pods", func() (bool, string) {
		pods, err := e.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		n := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && p.Spec.NodeName == node.Name {
				n++
			}
		}
		return n == 3, fmt.Sprintf("%d of %d running", n, len(pods.Items))
	})
	began := time.Now()
	if err := e.Kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "namespace "+ns+" gone", func() (bool, string) {
		got, err := e.Kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, ""
		}
		if err != nil {
			return false, err.Error()
		}
		var conds []string
		for _, c := range got.Status.Conditions {
			if c.Status == corev1.ConditionTrue {
				conds = append(conds, fmt.Sprintf("%s: %s", c.Type, c.Message))
			}
		}
		return false, fmt.Sprintf("%s %s", got.Status.Phase, strings.Join(conds, "; "))
	})
	t.Logf("namespace with 3 running pods deleted in %s", time.Since(began).Round(time.Millisecond))
}

func testDeployment(ns, name string, replicas int32, nodeSelector map[string]string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					// kwok deletes a Pod at a random moment of its grace period, as a kubelet may.
					TerminationGracePeriodSeconds: ptr.To[int64](2),
					NodeSelector:                  nodeSelector,
					Containers:                    []corev1.Container{{Name: "app", Image: "registry.invalid/app:1"}},
				},
			},
		},
	}
}

// waitFor polls cond every 100ms until it holds, failing t after timeout with cond's last state.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s: %s", timeout, what, state)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// BenchmarkStart measures starting a whole environment (etcd, kube-apiserver, the CRDs
// Established, controller-manager and scheduler healthy) and stopping it.
func BenchmarkStart(b *testing.B) {
	if _, err := findBinaries(controlPlaneBinaries...); err != nil {
		need.Missing(b, "%v", err)
	}
	var total time.Duration
	n := 0
	for b.Loop() {
		e, err := start(b.Logf)
		if err != nil {
			b.Fatal(err)
		}
		total += e.StartupTime
		n++
		e.Stop()
	}
	b.ReportMetric(total.Seconds()/float64(n), "start-s/op")
}

// TestReadyNodeKeepsPodStatus: the node lifecycle controller leaves a ReadyNode and the status
// written on a Pod bound to it alone, after it has marked NotReady the Pod of a Node that
// reported Ready once and then stopped renewing.
func TestReadyNodeKeepsPodStatus(t *testing.T) {
	t.Parallel()
	e := Get(t)
	ns := e.Namespace(t)
	ctx := t.Context()
	kept := e.ReadyNode(t, "ready-"+ns, nil)
	silent, err := e.Kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "silent-" + ns}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Kube.CoreV1().Nodes().Delete(context.Background(), silent.Name, metav1.DeleteOptions{}) })
	if _, err := e.reportReady(ctx, silent.Name); err != nil {
		t.Fatal(err)
	}
	readyPod := func(name, node string) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main", Image: "busybox"}}}}
		if _, err := e.Kube.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// The node lifecycle controller writes pods' status too: the status is written on the
		// latest pod, again on a conflict.
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			p, err := e.Kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			p.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
			_, err = e.Kube.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	readyPod("on-kept", kept.Name)
	readyPod("on-silent", silent.Name)
	podReady := func(name string) (bool, string) {
		p, err := e.Kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				return c.Status == corev1.ConditionTrue, fmt.Sprintf("pod %s Ready %s", name, c.Status)
			}
		}
		return false, "pod " + name + " has no Ready condition"
	}
	// The controller's grace for a Node that stopped reporting is 50 s.
	waitFor(t, 3*time.Minute, "the pod on the silent node marked NotReady", func() (bool, string) {
		ready, state := podReady("on-silent")
		return !ready, state
	})
	if ready, state := podReady("on-kept"); !ready {
		t.Errorf("%s, want it left Ready", state)
	}
	n, err := e.Kube.CoreV1().Nodes().Get(ctx, kept.Name, metav1.GetOptions{})
	if err != nil || !nodeReady(n) {
		t.Errorf("node %s after the grace period: %v %+v", kept.Name, err, n.Status.Conditions)
	}
}
