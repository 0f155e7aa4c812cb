// Package controlplane holds what kip's two ways of running a Kubernetes control plane from its
// binaries share: test/testenv (a throw-away control plane for Go tests) and test/k3s-standin
// (the lab's k3s stand-in). That is certificate issuing, kubeconfig writing, starting and
// stopping child processes, waiting for them to be ready, and the flags etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler run with in both.
//
// The stand-in is a program, not a test: this package must not import testing.
package controlplane

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

// KeyPair is a certificate and its private key, parsed and PEM encoded.
type KeyPair struct {
	Cert    *x509.Certificate
	CertPEM []byte // a caller may append the CA's certificate, so that TLS peers receive it
	Key     crypto.Signer
	KeyPEM  []byte
}

// NewKey generates an ECDSA P-256 key and returns it with its PEM encoding ("EC PRIVATE KEY").
func NewKey() (*ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate key: %w", err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encode key: %w", err)
	}
	return key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// Serial returns a random certificate serial number below 2⁶².
func Serial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, fmt.Errorf("generate serial number: %w", err)
	}
	return n, nil
}

// EncodeCert returns a DER certificate PEM encoded ("CERTIFICATE").
func EncodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// Template is what Issue puts in a certificate. The callers differ in key usages and lifetimes,
// so those are theirs to choose.
type Template struct {
	Subject     pkix.Name
	IsCA        bool // a CA: basic constraints CA:TRUE
	KeyUsage    x509.KeyUsage
	ExtKeyUsage []x509.ExtKeyUsage
	DNSNames    []string
	IPAddresses []net.IP
	NotAfter    time.Time // the certificate is valid from an hour ago (clock skew) until NotAfter
}

// Issue creates a key and a certificate for it, signed by ca or, when ca is nil, by itself.
func Issue(ca *KeyPair, t Template) (*KeyPair, error) {
	key, keyPEM, err := NewKey()
	if err != nil {
		return nil, err
	}
	sn, err := Serial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               t.Subject,
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              t.NotAfter,
		KeyUsage:              t.KeyUsage,
		ExtKeyUsage:           t.ExtKeyUsage,
		DNSNames:              t.DNSNames,
		IPAddresses:           t.IPAddresses,
		BasicConstraintsValid: t.IsCA,
		IsCA:                  t.IsCA,
	}
	parent, signer := tmpl, crypto.Signer(key)
	if ca != nil {
		parent, signer = ca.Cert, ca.Key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), signer)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &KeyPair{Cert: cert, CertPEM: EncodeCert(der), Key: key, KeyPEM: keyPEM}, nil
}

// Kubeconfig is a self-contained kubeconfig: the cluster's CA and the client's certificate and
// key are embedded.
type Kubeconfig struct {
	Name   string // of the cluster and of the context, which is the current one
	User   string
	Server string
	CAPEM  []byte
	Client *KeyPair
}

// Encode renders the kubeconfig.
func (k Kubeconfig) Encode() ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[k.Name] = &clientcmdapi.Cluster{Server: k.Server, CertificateAuthorityData: k.CAPEM}
	cfg.AuthInfos[k.User] = &clientcmdapi.AuthInfo{ClientCertificateData: k.Client.CertPEM, ClientKeyData: k.Client.KeyPEM}
	cfg.Contexts[k.Name] = &clientcmdapi.Context{Cluster: k.Name, AuthInfo: k.User}
	cfg.CurrentContext = k.Name
	return clientcmd.Write(*cfg)
}

// Write writes the kubeconfig to path with mode (see WriteFile).
func (k Kubeconfig) Write(path string, mode os.FileMode) error {
	data, err := k.Encode()
	if err != nil {
		return fmt.Errorf("encode kubeconfig %s: %w", path, err)
	}
	return WriteFile(path, data, mode)
}

// RESTConfig returns a client configuration for server that trusts caPEM and authenticates with
// client's certificate; callers add their rate limits, timeout and user agent.
func RESTConfig(server string, caPEM []byte, client *KeyPair) *rest.Config {
	return &rest.Config{
		Host:            server,
		TLSClientConfig: rest.TLSClientConfig{CAData: caPEM, CertData: client.CertPEM, KeyData: client.KeyPEM},
	}
}

// WriteFile replaces path with data and exactly mode (no umask), so that a reader never sees half
// a file. It creates path's directory (0755) if needed.
func WriteFile(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create directory for %s: %w", path, err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(f.Name()) // after a successful rename there is nothing left to remove
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
