package testenv

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// keyPair is a certificate and its private key, PEM encoded.
type keyPair struct {
	cert, key []byte
}

// pki is the environment's certificate authority and the credentials it issued.
type pki struct {
	caCert   *x509.Certificate
	caKey    crypto.Signer
	ca       keyPair
	serving  keyPair // kube-apiserver's serving certificate
	saKey    []byte  // service-account token signing key (PEM, private)
	saPub    []byte  // its public half
	admin    keyPair // CN=kip-testenv-admin, O=system:masters
	kcm      keyPair // CN=system:kube-controller-manager
	sched    keyPair // CN=system:kube-scheduler
	notAfter time.Time
}

func newPKI() (*pki, error) {
	p := &pki{notAfter: time.Now().Add(7 * 24 * time.Hour)}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate ca key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "kip-testenv-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              p.notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, caKey.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("create ca certificate: %w", err)
	}
	if p.caCert, err = x509.ParseCertificate(der); err != nil {
		return nil, fmt.Errorf("parse ca certificate: %w", err)
	}
	p.caKey = caKey
	if p.ca.key, err = encodeKey(caKey); err != nil {
		return nil, err
	}
	p.ca.cert = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})

	if p.serving, err = p.issue(pkix.Name{CommonName: "kube-apiserver"}, x509.ExtKeyUsageServerAuth,
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		[]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, net.IPv4(10, 43, 0, 1)}); err != nil {
		return nil, fmt.Errorf("issue serving certificate: %w", err)
	}
	clients := []struct {
		into *keyPair
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

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate service-account key: %w", err)
	}
	if p.saKey, err = encodeKey(saKey); err != nil {
		return nil, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return nil, fmt.Errorf("encode service-account public key: %w", err)
	}
	p.saPub = pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	return p, nil
}

func (p *pki) issue(subject pkix.Name, usage x509.ExtKeyUsage, dns []string, ips []net.IP) (keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return keyPair{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      subject,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     p.notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     dns,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, key.Public(), p.caKey)
	if err != nil {
		return keyPair{}, err
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return keyPair{}, err
	}
	return keyPair{cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key: keyPEM}, nil
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

// writeFiles writes the PEM files the control plane's flags name into dir.
func (p *pki) writeFiles(dir string) error {
	files := map[string][]byte{
		"ca.crt":        p.ca.cert,
		"ca.key":        p.ca.key,
		"apiserver.crt": p.serving.cert,
		"apiserver.key": p.serving.key,
		"sa.key":        p.saKey,
		"sa.pub":        p.saPub,
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	return nil
}

// writeKubeconfig writes a self-contained kubeconfig (cluster CA and client certificate embedded)
// with mode 0600.
func writeKubeconfig(path, server, user string, ca []byte, client keyPair) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["testenv"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: client.cert, ClientKeyData: client.key}
	cfg.Contexts["testenv"] = &clientcmdapi.Context{Cluster: "testenv", AuthInfo: user}
	cfg.CurrentContext = "testenv"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return fmt.Errorf("encode kubeconfig %s: %w", filepath.Base(path), err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

func restConfig(server string, ca []byte, client keyPair) *rest.Config {
	return &rest.Config{
		Host: server,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   ca,
			CertData: client.cert,
			KeyData:  client.key,
		},
		QPS:       200,
		Burst:     400,
		UserAgent: "kip-testenv",
	}
}
