package upgrade

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/test/testenv"
)

// addIngress creates the Ingress name in ns routing one path to each backend ("service:port", a
// port number or name), of class (none when ""), with labels; console-api's when managed.
func addIngress(t testing.TB, cl *kube.Clients, ns, name, class string, labels map[string]string, backends ...string) *networkingv1.Ingress {
	t.Helper()
	var paths []networkingv1.HTTPIngressPath
	for i, b := range backends {
		svc, port, _ := strings.Cut(b, ":")
		p := networkingv1.ServiceBackendPort{Name: port}
		if n, err := fmt.Sscan(port, &p.Number); err == nil && n == 1 {
			p.Name = ""
		}
		paths = append(paths, networkingv1.HTTPIngressPath{Path: fmt.Sprintf("/p%d", i), PathType: ptr.To(networkingv1.PathTypePrefix),
			Backend: networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: svc, Port: p}}})
	}
	ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{{Host: name + ".example.com",
			IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{Paths: paths}}}}}}
	if class != "" {
		ing.Spec.IngressClassName = ptr.To(class)
	}
	created, err := cl.Kube.NetworkingV1().Ingresses(ns).Create(context.Background(), ing, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return created
}

var byConsoleAPI = map[string]string{RouteManagedByLabel: RouteManagedBy}

// addNamespace creates namespace name, deleted when t ends. The tests share one cluster: a
// namespace of that name an earlier test left (the installed cluster's kipper-system) goes first.
func addNamespace(t testing.TB, cl *kube.Clients, name string) {
	t.Helper()
	if err := deleteNamespace(cl, name); err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := cl.Kube.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deleteAtCleanup(t, cl, name)
}

// TestRouteCheck reads the routes of a real API server (Ingresses, Apps and Kipper Services) in
// three requests however many there are, prints spec 002's example, and removes the route
// Kipper manages with its UID for precondition.
func TestRouteCheck(t *testing.T) {
	env := testenv.Get(t)
	cl, n := testenv.CountingClients(t, env.Config)
	ctx := context.Background()

	// The console as kip renders it, in kipper-system.
	addNamespace(t, cl, "kipper-system")
	addIngress(t, cl, "kipper-system", "console", components.IngressClass, map[string]string{"app.kubernetes.io/managed-by": "kip"},
		"console-api:8080", "console-api:8080", "console:80")
	// Spec 002's example: app system-console-api in namespace kipper, routed by console-api and by
	// hand, and by an Ingress of another class, which Traefik does not serve.
	addNamespace(t, cl, "kipper")
	addApp(t, cl, "kipper", "system-console-api", map[string]any{"replicas": int64(1)}, -1)
	managed := addIngress(t, cl, "kipper", "system-console-api", components.IngressClass, byConsoleAPI, "system-console-api:8080")
	addIngress(t, cl, "kipper", "by-hand", "", nil, "system-console-api:8080")
	addIngress(t, cl, "kipper", "other-class", "nginx", byConsoleAPI, "system-console-api:8080")
	// An app and a service of one route name; an Ingress of no app or service.
	ns := projectNamespace(t, cl, "routes", "prod")
	addApp(t, cl, ns, "api", map[string]any{"replicas": int64(1)}, -1)
	addIngress(t, cl, ns, "api", components.IngressClass, byConsoleAPI, "api:80")
	addNamespace(t, cl, "routes")
	files := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Service",
		"metadata": map[string]any{"name": "prod-api", "namespace": "routes"}, "spec": map[string]any{"type": "minio"}}}
	if _, err := cl.Dynamic.Resource(service.ServicesGVR).Namespace("routes").Create(ctx, files, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	addIngress(t, cl, "routes", "prod-api", components.IngressClass, byConsoleAPI, "prod-api:http")
	addIngress(t, cl, ns, "not-an-app", components.IngressClass, nil, "kipper-system-console-api:8080")

	n.Take()
	routes, installed, err := ReadRoutes(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	requests, _ := n.Take()
	var got []string
	for _, r := range routes {
		got = append(got, fmt.Sprintf("%s (Ingress %s, managed %v)", r, r.Ingress, r.Managed))
	}
	wantRoutes := []string{
		"app system-console-api in namespace kipper on port 8080 (Ingress kipper/by-hand, managed false)",
		"app system-console-api in namespace kipper on port 8080 (Ingress kipper/system-console-api, managed true)",
		"service prod-api in namespace routes on port http (Ingress routes/prod-api, managed true)",
		"app api in namespace routes-prod on port 80 (Ingress routes-prod/api, managed true)",
	}
	if !slices.Equal(got, wantRoutes) {
		t.Errorf("routes\n got %q\nwant %q", got, wantRoutes)
	}
	var running []string
	for _, r := range installed {
		running = append(running, r.Component+" "+r.TraefikService())
	}
	if want := []string{"console kipper-system-console-api-8080", "console kipper-system-console-80"}; !slices.Equal(running, want) {
		t.Errorf("installed routes %q, want %q", running, want)
	}
	c := CheckRoutes(routes, installed)
	var out bytes.Buffer
	c.Write(&out)
	want := `  ✗   These routes conflict with an installed Kipper component on the same port:
      - app system-console-api in namespace kipper on port 8080 conflicts with the console API.
          Kipper does not manage its route, the Ingress kipper/by-hand: remove it manually.
      - app system-console-api in namespace kipper on port 8080 conflicts with the console API.
          kip upgrade removes its route, the Ingress kipper/system-console-api, which Kipper manages. Use a different app name to keep the app reachable.
      kip upgrade requires confirmation before it removes the routes Kipper manages. Use --yes to confirm without a prompt.
  !   These apps and services have conflicting route names. The upgrade keeps their existing routes:
      - service prod-api in namespace routes on port http and app api in namespace routes-prod on port 80 share the route name routes-prod-api.
      Give each a distinct name.
`
	if out.String() != want {
		t.Errorf("the check printed\n%s\nwant\n%s", out.String(), want)
	}
	ref := IngressRef{Namespace: "kipper", Name: "system-console-api", UID: managed.UID}
	if !c.Fails() || !slices.Equal(c.Removals(), []IngressRef{ref}) {
		t.Fatalf("the check fails: %v, removes %v; want it to fail and remove %v", c.Fails(), c.Removals(), ref)
	}

	// Fifty more apps, each with its route: the same three requests.
	more := projectNamespace(t, cl, "routes", "test")
	for i := range 50 {
		name := fmt.Sprintf("app%02d", i)
		addApp(t, cl, more, name, map[string]any{"replicas": int64(1)}, -1)
		addIngress(t, cl, more, name, components.IngressClass, byConsoleAPI, name+":80")
	}
	n.Take()
	if routes, _, err = ReadRoutes(ctx, cl); err != nil || len(routes) != 54 {
		t.Fatalf("read %d routes, %v", len(routes), err)
	}
	if again, paths := n.Take(); requests != 3 || again != requests {
		t.Errorf("ReadRoutes made %d requests with 4 routes, %d with 54 (%q); want 3 each", requests, again, paths)
	}

	// The removal: not done yet; a precondition of another UID leaves the Ingress; the removal,
	// then again (NotFound is done).
	if done, err := RouteRemoved(ctx, cl, ref); err != nil || done {
		t.Fatalf("before the removal, RouteRemoved = %v, %v", done, err)
	}
	stale := ref
	stale.UID = "00000000-0000-0000-0000-000000000000"
	if err := RemoveRoute(ctx, cl, stale); err != nil {
		t.Fatalf("the removal of another Ingress of that name: %v", err)
	}
	if _, err := cl.Kube.NetworkingV1().Ingresses("kipper").Get(ctx, "system-console-api", metav1.GetOptions{}); err != nil {
		t.Fatalf("a removal whose UID is another Ingress's removed it: %v", err)
	}
	n.Take()
	if err := RemoveRoute(ctx, cl, ref); err != nil {
		t.Fatal(err)
	}
	if writes, paths := n.Take(); writes != 1 || !strings.HasPrefix(paths[0], "DELETE ") {
		t.Errorf("the removal made %q, want one DELETE", paths)
	}
	if _, err := cl.Kube.NetworkingV1().Ingresses("kipper").Get(ctx, "system-console-api", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("after the removal, the Ingress: %v", err)
	}
	if done, err := RouteRemoved(ctx, cl, ref); err != nil || !done {
		t.Fatalf("after the removal, RouteRemoved = %v, %v", done, err)
	}
	if err := RemoveRoute(ctx, cl, ref); err != nil {
		t.Fatalf("the removal again: %v", err)
	}
	if _, err := cl.Kube.NetworkingV1().Ingresses("kipper").Get(ctx, "by-hand", metav1.GetOptions{}); err != nil {
		t.Errorf("the route made by hand: %v", err)
	}

	// console-api makes the route again: a new Ingress, which the recorded removal leaves alone.
	again := addIngress(t, cl, "kipper", "system-console-api", components.IngressClass, byConsoleAPI, "system-console-api:8080")
	if done, err := RouteRemoved(ctx, cl, ref); err != nil || !done {
		t.Errorf("with a new Ingress of that name, RouteRemoved = %v, %v", done, err)
	}
	if err := RemoveRoute(ctx, cl, ref); err != nil {
		t.Fatal(err)
	}
	if got, err := cl.Kube.NetworkingV1().Ingresses("kipper").Get(ctx, "system-console-api", metav1.GetOptions{}); err != nil || got.UID != again.UID {
		t.Errorf("the recorded removal removed a new Ingress of that name: %v", err)
	}
}
