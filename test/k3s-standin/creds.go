package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"kipper.run/kip/test/controlplane"
)

// A node's components reach the API server with credentials of their own, as on a k3s node: the
// kubelet with the Node's (system:node:<name>, which the Node authorizer and NodeRestriction
// limit to what a kubelet may), kube-proxy with system:kube-proxy (Kubernetes' default binding
// system:node-proxier covers it) and flannel and k3s's agent-side controllers with
// system:k3s-controller (k3s's role of that name, see bootstrapRBAC); the stand-in's route keeping
// and its read of the server's flannel backend stand in for those. k3s's agent fetches their
// certificates from its server's supervisor with the token (/v1-k3s/client-kubelet.crt,
// client-kube-proxy.crt, client-k3s-controller.crt); a stand-in agent requests them from
// kube-apiserver with the token (see join), and a server issues its own Node's from the client CA.
const (
	kubeletKubeconfig    = "kubelet.kubeconfig"
	kubeProxyKubeconfig  = "kubeproxy.kubeconfig"
	controllerKubeconfig = "k3scontroller.kubeconfig"
	kwokKubeconfig       = "standin-kwok.kubeconfig"
)

// kwokGroup is a group only kwok's certificate carries, beside the Node's own identity. kwok
// (v0.8.0) lists Nodes once when it starts, which a kubelet may not, so bootstrapRBAC binds this
// group to system:k3s-controller; everything else kwok does (the Node's Pods, their status) it does
// as the Node. This is the stand-in's own need: a real node runs no kwok.
const kwokGroup = "k3s-standin:kwok"

// nodeCreds are the client certificates of a node's components.
type nodeCreds struct {
	kubelet, kubeProxy, controller *controlplane.KeyPair
	kwok                           *controlplane.KeyPair // with standin-kubelet kwok only
}

// nodeIdentity is one of a node's client certificates: agent/<name>.{crt,key}, and its
// kubeconfig agent/<kubeconfig>, with k3s's file names.
type nodeIdentity struct {
	into             **controlplane.KeyPair
	name, kubeconfig string
	spec             certSpec
	signer           string // the signer an agent's certificate request names
}

// identities are the node's client certificates, to be kept in c.
func (n *node) identities(c *nodeCreds) []nodeIdentity {
	client := func(cn string, orgs ...string) certSpec {
		return certSpec{cn: cn, orgs: orgs, usage: x509.ExtKeyUsageClientAuth}
	}
	ids := []nodeIdentity{
		{&c.kubelet, "client-kubelet", kubeletKubeconfig, client("system:node:"+n.name, "system:nodes"), certificatesv1.KubeAPIServerClientKubeletSignerName},
		{&c.kubeProxy, "client-kube-proxy", kubeProxyKubeconfig, client("system:kube-proxy"), certificatesv1.KubeAPIServerClientSignerName},
		{&c.controller, "client-k3s-controller", controllerKubeconfig, client("system:k3s-controller"), certificatesv1.KubeAPIServerClientSignerName},
	}
	if n.kwok {
		ids = append(ids, nodeIdentity{&c.kwok, "standin-client-kwok", kwokKubeconfig,
			client("system:node:"+n.name, "system:nodes", kwokGroup), certificatesv1.KubeAPIServerClientSignerName})
	}
	return ids
}

// credPaths are where the node keeps the certificate name and its key.
func (n *node) credPaths(name string) (string, string) {
	return filepath.Join(n.agentDir(), name+".crt"), filepath.Join(n.agentDir(), name+".key")
}

// issueCredentials loads the server's own Node's certificates, or issues them from the client
// CA, as ensureCert does.
func (n *node) issueCredentials(ca *controlplane.KeyPair) (*nodeCreds, error) {
	c := &nodeCreds{}
	for _, id := range n.identities(c) {
		cert, key := n.credPaths(id.name)
		kp, err := ensureCert(cert, key, ca, id.spec)
		if err != nil {
			return nil, err
		}
		*id.into = kp
	}
	return c, nil
}

// nodeClients are a node's API clients: with the kubelet's credentials, and with
// k3s-controller's for what k3s's agent-side controllers do.
type nodeClients struct{ kubelet, controller kubernetes.Interface }

func (c *nodeCreds) clients(server string, caPEM []byte) (nodeClients, error) {
	kubelet, err := kubernetes.NewForConfig(restConfig(server, caPEM, c.kubelet))
	if err != nil {
		return nodeClients{}, fmt.Errorf("node client: %w", err)
	}
	controller, err := kubernetes.NewForConfig(restConfig(server, caPEM, c.controller))
	if err != nil {
		return nodeClients{}, fmt.Errorf("k3s-controller client: %w", err)
	}
	return nodeClients{kubelet, controller}, nil
}

// approveAgentCerts approves, until ctx ends, what k3s's supervisor hands an agent for the
// token and the controller-manager's approver does not: requests the token's user makes for the
// kube-apiserver-client signer for kube-proxy's, k3s-controller's or kwok's certificate. The
// controller-manager signs them from the client CA. Other requests stay pending.
func approveAgentCerts(ctx context.Context, admin kubernetes.Interface) {
	csrs := informers.NewSharedInformerFactory(admin, 0).Certificates().V1().CertificateSigningRequests().Informer()
	_, err := csrs.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(obj any) {
		csr, ok := obj.(*certificatesv1.CertificateSigningRequest)
		if !ok || csr.Spec.SignerName != certificatesv1.KubeAPIServerClientSignerName || csr.Spec.Username != bootstrapUser ||
			len(csr.Status.Conditions) > 0 || !agentMayRequest(csr.Spec.Request) {
			return
		}
		csr = csr.DeepCopy()
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue,
			Reason: "K3sStandinApprove", Message: "a node component's certificate, requested with the token",
		})
		if _, err := admin.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil && ctx.Err() == nil {
			slog.Warn("approve certificate request", "name", csr.Name, "err", err)
		}
	}})
	if err != nil {
		slog.Warn("watch certificate requests", "err", err)
		return
	}
	csrs.Run(ctx.Done())
}

// agentMayRequest reports whether a PEM certificate request asks for one of a node's
// certificates that an agent gets from the kube-apiserver-client signer, and names nothing else.
func agentMayRequest(request []byte) bool {
	block, _ := pem.Decode(request)
	if block == nil {
		return false
	}
	r, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil || len(r.DNSNames)+len(r.IPAddresses)+len(r.EmailAddresses)+len(r.URIs) > 0 {
		return false
	}
	n := &node{name: strings.TrimPrefix(r.Subject.CommonName, "system:node:"), kwok: true}
	return slices.ContainsFunc(n.identities(&nodeCreds{}), func(id nodeIdentity) bool {
		return id.signer == certificatesv1.KubeAPIServerClientSignerName &&
			id.spec.cn == r.Subject.CommonName && slices.Equal(id.spec.orgs, r.Subject.Organization)
	})
}
