package testenv

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net"
	"path/filepath"
	"time"

	"k8s.io/client-go/rest"

	"kipper.run/kip/test/controlplane"
)

// pki is the environment's certificate authority and the credentials it issued.
type pki struct {
	ca       *controlplane.KeyPair
	serving  *controlplane.KeyPair // kube-apiserver's serving certificate
	saKey    []byte                // service-account token signing key (PEM, private)
	saPub    []byte                // its public half
	admin    *controlplane.KeyPair // CN=kip-testenv-admin, O=system:masters
	kcm      *controlplane.KeyPair // CN=system:kube-controller-manager
	sched    *controlplane.KeyPair // CN=system:kube-scheduler
	notAfter time.Time
}

func newPKI() (*pki, error) {
	p := &pki{notAfter: time.Now().Add(7 * 24 * time.Hour)}
	var err error
	if p.ca, err = controlplane.Issue(nil, controlplane.Template{
		Subject:  pkix.Name{CommonName: "kip-testenv-ca"},
		IsCA:     true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		NotAfter: p.notAfter,
	}); err != nil {
		return nil, fmt.Errorf("create ca certificate: %w", err)
	}

	if p.serving, err = p.issue(pkix.Name{CommonName: "kube-apiserver"}, x509.ExtKeyUsageServerAuth,
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		[]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, net.IPv4(10, 43, 0, 1)}); err != nil {
		return nil, fmt.Errorf("issue serving certificate: %w", err)
	}
	clients := []struct {
		into **controlplane.KeyPair
		name pkix.Name
	}{
		{&p.admin, pkix.Name{CommonName: "kip-testenv-admin", Organization: []string{"system:masters"}}},
		{&p.kcm, pkix.Name{CommonName: "system:kube-controller-manager"}},
		{&p.sched, pkix.Name{CommonName: "system:kube-scheduler"}},
	}
	for _, c := range clients {
		if *c.into, err = p.issue(c.name, x509.ExtKeyUsageClientAuth, nil, nil); err != nil {
			return nil, fmt.Errorf("issue client certificate %s: %w", c.name.CommonName, err)
		}
	}

	saKey, saKeyPEM, err := controlplane.NewKey()
	if err != nil {
		return nil, fmt.Errorf("service-account key: %w", err)
	}
	p.saKey = saKeyPEM
	pubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return nil, fmt.Errorf("encode service-account public key: %w", err)
	}
	p.saPub = pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	return p, nil
}

func (p *pki) issue(subject pkix.Name, usage x509.ExtKeyUsage, dns []string, ips []net.IP) (*controlplane.KeyPair, error) {
	return controlplane.Issue(p.ca, controlplane.Template{
		Subject:     subject,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{usage},
		DNSNames:    dns,
		IPAddresses: ips,
		NotAfter:    p.notAfter,
	})
}

// writeFiles writes the PEM files the control plane's flags name into dir, mode 0600.
func (p *pki) writeFiles(dir string) error {
	files := map[string][]byte{
		"ca.crt":        p.ca.CertPEM,
		"ca.key":        p.ca.KeyPEM,
		"apiserver.crt": p.serving.CertPEM,
		"apiserver.key": p.serving.KeyPEM,
		"sa.key":        p.saKey,
		"sa.pub":        p.saPub,
	}
	for name, data := range files {
		if err := controlplane.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// writeKubeconfig writes a self-contained kubeconfig (cluster CA and client certificate embedded)
// with mode 0600.
func writeKubeconfig(path, server, user string, ca []byte, client *controlplane.KeyPair) error {
	return controlplane.Kubeconfig{Name: "testenv", User: user, Server: server, CAPEM: ca, Client: client}.Write(path, 0o600)
}

func restConfig(server string, ca []byte, client *controlplane.KeyPair) *rest.Config {
	cfg := controlplane.RESTConfig(server, ca, client)
	cfg.QPS = 200
	cfg.Burst = 400
	cfg.UserAgent = "kip-testenv"
	return cfg
}
