package components

import (
	"context"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
)

// TestProjectRoles applies kipper-base to a real API server and uses its project operator roles
// as console-api does: console-api (impersonated, its ServiceAccount) binds each role to a member
// in a project's namespace, but not cluster-admin; the API server's own authorizer then lets
// each member do what its role says and no more.
func TestProjectRoles(t *testing.T) {
	env, cl := apiTestClients(t)
	ctx := context.Background()
	base := componentNamed(t, renderComponents(t, testOptions(t, "nano", cluster.StorageLocal)), "kipper-base")
	if err := kube.Apply(ctx, cl, base.Objects, kube.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	ns := env.Namespace(t)

	as := rest.CopyConfig(env.Config)
	as.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + systemNamespace + ":console-api"}
	consoleAPI, err := kubernetes.NewForConfig(as)
	if err != nil {
		t.Fatal(err)
	}
	bind := func(user, role string) error {
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user, Namespace: ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}}}
		_, err := consoleAPI.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{})
		return err
	}
	members := map[string]string{"alice": ProjectViewerRole, "bob": ProjectDeployerRole, "carol": ProjectOwnerRole}
	for user, role := range members {
		if err := bind(user, role); err != nil {
			t.Fatalf("console-api binding %s to %s: %v", role, user, err)
		}
	}
	if err := bind("mallory", "cluster-admin"); !apierrors.IsForbidden(err) {
		t.Errorf("console-api binding cluster-admin in a project: %v, want forbidden", err)
	}

	for _, c := range []struct {
		user, verb, group, resource string
		allowed                     bool
	}{
		{"alice", "list", "kipper.run", "apps", true},
		{"alice", "get", "", "pods/log", true},
		{"alice", "create", "kipper.run", "apps", false},
		{"alice", "get", "", "secrets", false},
		{"bob", "create", "kipper.run", "services", true},
		{"bob", "delete", "", "pods", true},
		{"bob", "get", "", "secrets", false},
		{"bob", "delete", "kipper.run", "projects", false},
		{"bob", "create", "rbac.authorization.k8s.io", "rolebindings", false},
		{"carol", "get", "", "secrets", true},
		{"carol", "update", "kipper.run", "projects", true},
		{"carol", "create", "rbac.authorization.k8s.io", "rolebindings", true},
		{"carol", "create", "", "pods", false},
	} {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: c.user,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: c.verb, Group: c.group, Resource: c.resource}}}
		if res, sub, ok := strings.Cut(c.resource, "/"); ok {
			review.Spec.ResourceAttributes.Resource, review.Spec.ResourceAttributes.Subresource = res, sub
		}
		got, err := cl.Kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Allowed != c.allowed {
			t.Errorf("%s (%s) %s %s: allowed %v, want %v", c.user, members[c.user], c.verb, c.resource, got.Status.Allowed, c.allowed)
		}
	}
}
