package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Lifetimes as k3s's: CAs ten years, the rest a year, renewed on a start within 90 days of expiry.
const (
	caLifetime   = 10 * 365 * 24 * time.Hour
	leafLifetime = 365 * 24 * time.Hour
	renewBefore  = 90 * 24 * time.Hour
)

// keyPair is a certificate and its private key.
type keyPair struct {
	cert    *x509.Certificate
	certPEM []byte // the certificate, followed by its CA's for serving certificates
	key     crypto.Signer
	keyPEM  []byte
}

// certSpec describes a certificate to issue.
type certSpec struct {
	cn    string
	orgs  []string
	usage x509.ExtKeyUsage
	dns   []string
	ips   []net.IP
	chain bool // append the CA certificate to the certificate file, so TLS peers receive it
}

func newKey() (*ecdsa.PrivateKey, []byte, error) {
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

func serial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, fmt.Errorf("generate serial number: %w", err)
	}
	return n, nil
}

func encodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// loadKeyPair reads a certificate (the first in its file) and its key.
func loadKeyPair(certPath, keyPath string) (*keyPair, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s: no certificate", certPath)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", certPath, err)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, fmt.Errorf("%s: no key", keyPath)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", keyPath, err)
	}
	return &keyPair{cert: cert, certPEM: certPEM, key: key, keyPEM: keyPEM}, nil
}

func (kp *keyPair) write(certPath, keyPath string) error {
	if err := writeFileAtomic(keyPath, kp.keyPEM, 0o600); err != nil {
		return err
	}
	return writeFileAtomic(certPath, kp.certPEM, 0o644)
}

// ensureCA loads the CA dir/name.{crt,key}, creating it on first start. An unreadable CA is an
// error, never replaced: every credential of the cluster hangs on it.
func ensureCA(dir, name, cn string) (*keyPair, error) {
	certPath, keyPath := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	kp, err := loadKeyPair(certPath, keyPath)
	if err == nil {
		return kp, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("load %s: %w", name, err)
	}
	key, keyPEM, err := newKey()
	if err != nil {
		return nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: fmt.Sprintf("%s@%d", cn, now.Unix())},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", name, err)
	}
	kp = &keyPair{cert: cert, certPEM: encodeCert(der), key: key, keyPEM: keyPEM}
	if err := kp.write(certPath, keyPath); err != nil {
		return nil, err
	}
	return kp, nil
}

// ensureCert returns the certificate at certPath/keyPath when it is what spec asks for, signed
// by ca (self-signed when ca is nil) and not due for renewal; otherwise it issues and writes a
// new one.
func ensureCert(certPath, keyPath string, ca *keyPair, spec certSpec) (*keyPair, error) {
	if kp, err := loadKeyPair(certPath, keyPath); err == nil && spec.satisfiedBy(kp.cert, ca) {
		return kp, nil
	}
	kp, err := issue(ca, spec)
	if err != nil {
		return nil, fmt.Errorf("issue %s: %w", filepath.Base(certPath), err)
	}
	if err := kp.write(certPath, keyPath); err != nil {
		return nil, err
	}
	return kp, nil
}

func (s certSpec) satisfiedBy(c *x509.Certificate, ca *keyPair) bool {
	var sigErr error
	if ca != nil {
		sigErr = c.CheckSignatureFrom(ca.cert)
	} else {
		sigErr = c.CheckSignature(c.SignatureAlgorithm, c.RawTBSCertificate, c.Signature)
	}
	if sigErr != nil || time.Until(c.NotAfter) < renewBefore ||
		c.Subject.CommonName != s.cn || !slices.Equal(c.Subject.Organization, s.orgs) ||
		!slices.Contains(c.ExtKeyUsage, s.usage) {
		return false
	}
	for _, d := range s.dns {
		if !slices.Contains(c.DNSNames, d) {
			return false
		}
	}
	for _, ip := range s.ips {
		if !slices.ContainsFunc(c.IPAddresses, ip.Equal) {
			return false
		}
	}
	return true
}

// issue creates a key and a certificate for it, signed by ca or, when ca is nil, by itself.
func issue(ca *keyPair, s certSpec) (*keyPair, error) {
	key, keyPEM, err := newKey()
	if err != nil {
		return nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: s.cn, Organization: s.orgs},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{s.usage},
		DNSNames:     s.dns,
		IPAddresses:  s.ips,
	}
	parent, signer := tmpl, crypto.Signer(key)
	if ca != nil {
		parent, signer = ca.cert, ca.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), signer)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	certPEM := encodeCert(der)
	if s.chain && ca != nil {
		certPEM = append(certPEM, ca.certPEM...)
	}
	return &keyPair{cert: cert, certPEM: certPEM, key: key, keyPEM: keyPEM}, nil
}

// writeKubeconfig writes a kubeconfig with the CA and client credentials embedded, named
// "default" throughout as k3s names them.
func writeKubeconfig(path string, mode os.FileMode, server string, caPEM []byte, client *keyPair) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["default"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos["default"] = &clientcmdapi.AuthInfo{ClientCertificateData: client.certPEM, ClientKeyData: client.keyPEM}
	cfg.Contexts["default"] = &clientcmdapi.Context{Cluster: "default", AuthInfo: "default"}
	cfg.CurrentContext = "default"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return fmt.Errorf("encode kubeconfig %s: %w", path, err)
	}
	return writeFileAtomic(path, data, mode)
}

// writeFileAtomic replaces path with data and mode, so a reader never sees half a file.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
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
