package upgrade

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/test/testenv"
)

// TestGatewayIdentity decides and records the gateway identity of a *.kipper.run cluster
// against a real API server, as the upgrade does: a cluster with an IP for a name has none; one
// that never registered is left alone and told so; a registered one (console-api keeps Traefik's
// copy of the hop certificate) gets its name and the address its server answers at recorded;
// a recorded address is kept when the server answers elsewhere, with the warning that a moved
// server needs a fresh registration.
func TestGatewayIdentity(t *testing.T) {
	env := testenv.Get(t)
	cl, err := kube.NewClients(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env.ReadyNode(t, "identity-server", map[string]string{"node-role.kubernetes.io/control-plane": "true"})
	answersAt(ctx, t, cl, "identity-server", "203.0.113.7")

	if id, err := readIdentity(ctx, cl, cluster.Record{Server: "203.0.113.7"}); err != nil || id.domain != "" || identityStep(cl, id) != nil {
		t.Fatalf("a cluster named by its IP: %+v, %v", id, err)
	}
	rec := cluster.Record{Server: "shop.kipper.run"}
	id, err := readIdentity(ctx, cl, rec)
	if err != nil {
		t.Fatal(err)
	}
	if msg, warn := id.say(); warn || !strings.Contains(msg, "shop.kipper.run has never registered with the kipper.run gateway: kip records no identity for it") || identityStep(cl, id) != nil {
		t.Errorf("a cluster that never registered: %q (warning %v), step %v", msg, warn, identityStep(cl, id) != nil)
	}

	// console-api registered it and keeps Traefik's copy of the hop certificate.
	if _, err := cl.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: hopCertNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hop := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: hopCertSecret, Namespace: hopCertNamespace}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": []byte("cert"), "tls.key": []byte("key")}}
	if _, err := cl.Kube.CoreV1().Secrets(hopCertNamespace).Create(ctx, hop, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if id, err = readIdentity(ctx, cl, rec); err != nil {
		t.Fatal(err)
	}
	if msg, _ := id.say(); msg != "" {
		t.Errorf("a registered cluster that answers where it is recorded: %q", msg)
	}
	step := identityStep(cl, id)
	if step == nil {
		t.Fatal("no step records a registered cluster's identity")
	}
	if done, err := step.Check(ctx); err != nil || done {
		t.Fatalf("the identity before it is recorded: done %v, %v", done, err)
	}
	if err := step.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	if done, err := step.Check(ctx); err != nil || !done {
		t.Fatalf("the identity once recorded: done %v, %v", done, err)
	}
	recorded(ctx, t, cl, "shop.kipper.run", "203.0.113.7")

	// The server moved: the recorded address stays, and the upgrade says why.
	answersAt(ctx, t, cl, "identity-server", "198.51.100.9")
	if id, err = readIdentity(ctx, cl, rec); err != nil {
		t.Fatal(err)
	}
	msg, warn := id.say()
	if !warn || !strings.Contains(msg, "shop.kipper.run is registered at 203.0.113.7, but the server answers at 198.51.100.9 now: kip keeps the recorded address") ||
		!strings.Contains(msg, "needs a fresh registration") {
		t.Errorf("a moved server: %q (warning %v)", msg, warn)
	}
	if done, err := identityStep(cl, id).Check(ctx); err != nil || !done {
		t.Errorf("a moved server's identity: done %v, %v; want the recorded one kept as it is", done, err)
	}
	recorded(ctx, t, cl, "shop.kipper.run", "203.0.113.7")
}

// answersAt gives node the external address addr.
func answersAt(ctx context.Context, t *testing.T, cl *kube.Clients, node, addr string) {
	t.Helper()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cl.Kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeExternalIP, Address: addr}, {Type: corev1.NodeInternalIP, Address: "10.0.0.5"}}
		_, err = cl.Kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// recorded checks the ClusterIdentity's name and address.
func recorded(ctx context.Context, t *testing.T, cl *kube.Clients, domain, address string) {
	t.Helper()
	u, err := cl.Dynamic.Resource(ClusterIdentitiesGVR).Get(ctx, IdentityName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d, _, _ := unstructured.NestedString(u.Object, "spec", "domain")
	a, _, _ := unstructured.NestedString(u.Object, "spec", "address")
	if d != domain || a != address {
		t.Errorf("the ClusterIdentity records %s at %s, want %s at %s", d, a, domain, address)
	}
}
