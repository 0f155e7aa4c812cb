package consolestandin_test

import (
	"context"
	"os"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/service"
	consolestandin "kipper.run/kip/test/console-standin"
	"kipper.run/kip/test/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// TestDelayAndDown runs the stand-in slow and then down against the real API server: a new
// Service gets its StatefulSet no sooner than Delay after it was created; while the stand-in is
// down a pass changes nothing, though the Service was stopped; once it is up again it scales the
// StatefulSet to zero, again no sooner than Delay after the change.
func TestDelayAndDown(t *testing.T) {
	env := testenv.Get(t)
	cl, err := kube.NewClients(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const delay = 2 * time.Second
	s := &consolestandin.Standin{Kube: cl.Kube, Dynamic: cl.Dynamic, Image: "kip.invalid/service", Interval: time.Second,
		Delay: delay, Logf: t.Logf}
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(sctx) }()
	t.Cleanup(func() { stop(); <-done })

	project := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Project",
		"metadata": map[string]any{"name": "slow"}, "spec": map[string]any{"environments": []any{map[string]any{"name": "prod"}}}}}
	if _, err := cl.Dynamic.Resource(service.ProjectsGVR).Create(ctx, project, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cl.Dynamic.Resource(service.ProjectsGVR).Delete(context.Background(), "slow", metav1.DeleteOptions{})
	})
	if err := kube.Poll(ctx, time.Minute, "namespace slow-prod", func(ctx context.Context) (bool, string, error) {
		_, err := cl.Kube.CoreV1().Namespaces().Get(ctx, "slow-prod", metav1.GetOptions{})
		return err == nil, "", nil
	}); err != nil {
		t.Fatal(err)
	}
	ref := service.Ref{Project: "slow", Environment: "prod", Name: "db"}
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Service",
		"metadata": map[string]any{"name": "db", "namespace": ref.Namespace()}, "spec": map[string]any{"type": "redis", "storage": "1Gi"}}}
	created := time.Now()
	if _, err := cl.Dynamic.Resource(service.ServicesGVR).Namespace(ref.Namespace()).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	replicas := func(want int32) time.Duration {
		t.Helper()
		if err := kube.Poll(ctx, time.Minute, "StatefulSet db at the replicas wanted", func(ctx context.Context) (bool, string, error) {
			sts, err := cl.Kube.AppsV1().StatefulSets(ref.Namespace()).Get(ctx, "db", metav1.GetOptions{})
			return err == nil && ptr.Deref(sts.Spec.Replicas, 1) == want, "", nil
		}); err != nil {
			t.Fatal(err)
		}
		return time.Since(created)
	}
	if took := replicas(1); took < delay {
		t.Errorf("StatefulSet db created %s after its Service, within the stand-in's delay of %s", took, delay)
	}

	s.Down()
	if err := service.SetStopped(ctx, cl.Dynamic, ref, true); err != nil {
		t.Fatal(err)
	}
	if err := s.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(delay) // past the delay: only the stand-in being down keeps it from acting now
	if err := s.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if sts, err := cl.Kube.AppsV1().StatefulSets(ref.Namespace()).Get(ctx, "db", metav1.GetOptions{}); err != nil || ptr.Deref(sts.Spec.Replicas, 1) != 1 {
		t.Errorf("the stand-in changed StatefulSet db while down (%v)", err)
	}
	created = time.Now()
	s.Up()
	if took := replicas(0); took < delay {
		t.Errorf("StatefulSet db scaled to zero %s after the stand-in came up, within its delay of %s", took, delay)
	}
	if err := service.WaitStopped(ctx, cl.Dynamic, cl.Kube, ref, time.Minute); err != nil {
		t.Error(err)
	}
}
