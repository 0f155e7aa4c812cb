package upgrade

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/workflow"
)

// The recorded gateway identity (spec 002): on a cluster whose name is a *.kipper.run one, the
// upgrade records that name and the address the cluster registers with on the ClusterIdentity,
// where the console reads them when it renews the registration (docs/console.md). An address
// already recorded is kept, never replaced; a cluster that now answers elsewhere is told that a
// moved server needs a fresh registration. A cluster that never registered is left alone and
// told so: only its operator knows whether it should hold the name.

// ClusterIdentitiesGVR is Kipper's ClusterIdentity (clusteridentities.kipper.run), one per
// cluster, named IdentityName.
var ClusterIdentitiesGVR = schema.GroupVersionResource{Group: "kipper.run", Version: "v1alpha1", Resource: "clusteridentities"}

const (
	// IdentityName is the cluster's one ClusterIdentity.
	IdentityName = "cluster"
	// gatewaySuffix ends the names the kipper.run gateway routes.
	gatewaySuffix = ".kipper.run"
	// hopCertNamespace and hopCertSecret are Traefik's copy of the hop certificate, which
	// console-api writes once the cluster registered with the gateway: the sign that it did.
	hopCertNamespace = "traefik"
	hopCertSecret    = "kipper-hop-cert"
)

// identity is what the upgrade decides about the gateway identity.
type identity struct {
	// domain is the cluster's *.kipper.run name, "" when it has none (nothing to do).
	domain string
	// registered: the cluster registered with the gateway (a recorded address, or the hop
	// certificate console-api keeps).
	registered bool
	// recorded is the address on the ClusterIdentity, "" when none; answers is the address the
	// server answers at now (its node's external address, else its internal one).
	recorded, answers string
}

// readIdentity reads what decides the gateway identity.
func readIdentity(ctx context.Context, cl *kube.Clients, rec cluster.Record) (identity, error) {
	id := identity{}
	if !strings.HasSuffix(rec.Server, gatewaySuffix) {
		return id, nil
	}
	id.domain = rec.Server
	u, err := cl.Dynamic.Resource(ClusterIdentitiesGVR).Get(ctx, IdentityName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return id, fmt.Errorf("read the ClusterIdentity: %w", err)
	default:
		id.recorded, _, _ = unstructured.NestedString(u.Object, "spec", "address")
	}
	id.registered = id.recorded != ""
	if !id.registered {
		_, err = cl.Kube.CoreV1().Secrets(hopCertNamespace).Get(ctx, hopCertSecret, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return id, fmt.Errorf("read Secret %s/%s: %w", hopCertNamespace, hopCertSecret, err)
		default:
			id.registered = true
		}
	}
	server, err := cluster.ServerNode(ctx, cl.Kube)
	if err != nil {
		return id, err
	}
	id.answers = cluster.NodeAddress(server, corev1.NodeExternalIP)
	if id.answers == "" {
		id.answers = cluster.NodeAddress(server, corev1.NodeInternalIP)
	}
	return id, nil
}

// address is the address the ClusterIdentity records: the one recorded, or where the server
// answers.
func (id identity) address() string {
	if id.recorded != "" {
		return id.recorded
	}
	return id.answers
}

// say tells the operator what the upgrade does with the identity, "" when nothing needs saying,
// and whether it is a warning.
func (id identity) say() (msg string, warn bool) {
	switch {
	case id.domain == "":
		return "", false
	case !id.registered:
		return fmt.Sprintf("%s has never registered with the kipper.run gateway: kip records no identity for it. Register it from the console if it should hold that name", id.domain), false
	case id.recorded != "" && id.answers != "" && id.recorded != id.answers:
		return fmt.Sprintf("%s is registered at %s, but the server answers at %s now: kip keeps the recorded address, since the gateway ties the name to it. "+
			"A server that has moved needs a fresh registration from the console", id.domain, id.recorded, id.answers), true
	}
	return "", false
}

// identityStep records the name and the address on the ClusterIdentity of a registered
// *.kipper.run cluster; nil when there is nothing to record.
func identityStep(cl *kube.Clients, id identity) *workflow.Step {
	if id.domain == "" || !id.registered || id.address() == "" {
		return nil
	}
	want := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kipper.run/v1alpha1", "kind": "ClusterIdentity",
		"metadata": map[string]any{"name": IdentityName},
		"spec":     map[string]any{"domain": id.domain, "address": id.address()},
	}}
	objs := []*unstructured.Unstructured{want}
	return &workflow.Step{
		Name: "gateway-identity", Title: fmt.Sprintf("Record %s at %s on the ClusterIdentity", id.domain, id.address()),
		Done: "Recorded the gateway identity", Already: "The gateway identity is already recorded",
		Check: func(ctx context.Context) (bool, error) {
			d, err := kube.Drift(ctx, cl, objs, "")
			return len(d) == 0, err
		},
		Apply: func(ctx context.Context) error {
			return kube.Apply(ctx, cl, objs, kube.ApplyOptions{Force: true})
		},
	}
}
