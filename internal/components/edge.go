package components

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// What kip install applies, as data: Components lists the components of a cluster in install order,
// each with the objects kip server-side applies on every run, the objects it only ever creates, the
// objects it applies once the component is ready, and a readiness check. docs/components.md is the
// operator's view of this file.
//
// Most components are Helm charts that k3s's embedded helm-controller installs from a
// helm.cattle.io/v1 HelmChart in kube-system; kip's own objects (CRDs, namespaces, RBAC, the
// console) are plain manifests.

func (r *renderer) traefik() (Component, error) {
	return r.chartComponent("traefik", "traefik", map[string]any{
		"ingressClass": map[string]any{"enabled": true, "isDefaultClass": true, "name": ingressClass},
		// k3s's ServiceLB publishes the LoadBalancer Service on every node's ports 80 and 443.
		"service": map[string]any{"spec": map[string]any{"type": "LoadBalancer"}},
	})
}

// certManagerResolvers are the DNS resolvers of cert-manager's DNS-01 checks.
const certManagerResolvers = "1.1.1.1:53,9.9.9.9:53"

func (r *renderer) certManager() (Component, error) {
	c, err := r.chartComponent("cert-manager", "cert-manager", map[string]any{
		"crds": map[string]any{"enabled": true, "keep": true},
		// The DNS resolvers of cert-manager's DNS-01 checks: public ones only, not the server's,
		// whose answers for its own network (split-horizon DNS) or a cached missing record would
		// keep a check failing once the record is out. kip upgrade re-applies them at the
		// release the cluster runs.
		"dns01RecursiveNameservers":     certManagerResolvers,
		"dns01RecursiveNameserversOnly": true,
	})
	if err != nil {
		return Component{}, err
	}
	// The console's and Dex's certificates come from Let's Encrypt over HTTP-01 through Traefik.
	acme := map[string]any{
		"server":              "https://acme-v02.api.letsencrypt.org/directory",
		"privateKeySecretRef": map[string]any{"name": "letsencrypt-account-key"},
		"solvers":             []any{map[string]any{"http01": map[string]any{"ingress": map[string]any{"ingressClassName": ingressClass}}}},
	}
	if r.o.AdminEmail != "" {
		acme["email"] = r.o.AdminEmail
	}
	issuer := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cert-manager.io/v1",
		"kind":       "ClusterIssuer",
		"metadata":   map[string]any{"name": clusterIssuer},
		"spec":       map[string]any{"acme": acme},
	}}
	c.After = append(c.After, labelled(issuer))
	return c, nil
}
