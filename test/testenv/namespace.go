package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestNameAnnotation records on a namespace made by Namespace which test made it.
const TestNameAnnotation = "testenv.kipper.run/test"

// Namespace creates a namespace unique to t (named after it), waits until its default
// ServiceAccount exists (so Pods can be created in it at once) and deletes it when t's cleanup
// runs, without waiting for the deletion to finish.
func (e *Env) Namespace(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name:        namespaceName(t.Name()),
		Annotations: map[string]string{TestNameAnnotation: t.Name()},
	}}
	if _, err := e.Kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create test namespace %s: %v", ns.Name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := e.Kube.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete test namespace %s: %v", ns.Name, err)
		}
	})
	if err := waitServiceAccount(ctx, e.Kube, ns.Name, nil); err != nil {
		t.Fatalf("test namespace %s: %v", ns.Name, err)
	}
	return ns.Name
}

// namespaceName makes a DNS label from a test name plus a random suffix.
func namespaceName(test string) string {
	var b strings.Builder
	dash := true
	for _, r := range strings.ToLower(test) {
		switch {
		case r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
			dash = false
		case !dash:
			b.WriteByte('-')
			dash = true
		}
	}
	base := strings.Trim(b.String(), "-")
	if len(base) > 48 {
		base = strings.TrimRight(base[:48], "-")
	}
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	if base == "" {
		base = "test"
	}
	return base + "-" + hex.EncodeToString(suffix)
}

// waitServiceAccount waits for the service-account controller to create namespace ns's default
// ServiceAccount; p, when set, is the controller-manager, whose early exit ends the wait.
func waitServiceAccount(ctx context.Context, kube kubernetes.Interface, ns string, p *process) error {
	for {
		if p != nil && p.Exited() {
			return p.ExitError()
		}
		_, err := kube.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for service account %s/default (made by the controller-manager): %w (last error: %v)", ns, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
