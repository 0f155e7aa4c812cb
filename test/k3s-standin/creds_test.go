package main

import (
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"testing"

	"kipper.run/kip/test/controlplane"
)

// TestAgentMayRequest: the server approves, for the token, kube-proxy's, k3s-controller's and
// kwok's certificates only, with no names beside the subject.
func TestAgentMayRequest(t *testing.T) {
	key, _, err := controlplane.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cn   string
		orgs []string
		dns  []string
		want bool
	}{
		{"system:kube-proxy", nil, nil, true},
		{"system:k3s-controller", nil, nil, true},
		{"system:node:agent-1", []string{"system:nodes", kwokGroup}, nil, true},
		{"system:kube-proxy", []string{"system:masters"}, nil, false},
		{"system:k3s-controller", nil, []string{"localhost"}, false},
		{"system:node:agent-1", []string{"system:nodes"}, nil, false}, // the kubelet's: the controller-manager approves those
		{"system:admin", []string{"system:masters"}, nil, false},
		{"system:node:agent-1", []string{kwokGroup}, nil, false},
	} {
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
			Subject: pkix.Name{CommonName: tc.cn, Organization: tc.orgs}, DNSNames: tc.dns}, key)
		if err != nil {
			t.Fatal(err)
		}
		if got := agentMayRequest(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})); got != tc.want {
			t.Errorf("agentMayRequest(%s %v %v) = %v, want %v", tc.cn, tc.orgs, tc.dns, got, tc.want)
		}
	}
	if agentMayRequest([]byte("not a request")) {
		t.Error("agentMayRequest accepted garbage")
	}
}
