package main

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"kipper.run/kip/test/controlplane"
)

// Lifetimes as k3s's: CAs ten years, the rest a year, renewed on a start within 90 days of expiry.
const (
	caLifetime   = 10 * 365 * 24 * time.Hour
	leafLifetime = 365 * 24 * time.Hour
	renewBefore  = 90 * 24 * time.Hour
)

// certSpec describes a certificate to issue.
type certSpec struct {
	cn    string
	orgs  []string
	usage x509.ExtKeyUsage
	dns   []string
	ips   []net.IP
	chain bool // append the CA certificate to the certificate file, so TLS peers receive it
}

// loadKeyPair reads a certificate (the first in its file) and its key.
func loadKeyPair(certPath, keyPath string) (*controlplane.KeyPair, error) {
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
	return &controlplane.KeyPair{Cert: cert, CertPEM: certPEM, Key: key, KeyPEM: keyPEM}, nil
}

// writeKeyPair writes the key (0600), then the certificate (0644).
func writeKeyPair(kp *controlplane.KeyPair, certPath, keyPath string) error {
	if err := controlplane.WriteFile(keyPath, kp.KeyPEM, 0o600); err != nil {
		return err
	}
	return controlplane.WriteFile(certPath, kp.CertPEM, 0o644)
}

// ensureCA loads the CA dir/name.{crt,key}, creating it on first start. An unreadable CA is an
// error, never replaced: every credential of the cluster hangs on it.
func ensureCA(dir, name, cn string) (*controlplane.KeyPair, error) {
	certPath, keyPath := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	kp, err := loadKeyPair(certPath, keyPath)
	if err == nil {
		return kp, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("load %s: %w", name, err)
	}
	now := time.Now()
	kp, err = controlplane.Issue(nil, controlplane.Template{
		Subject:  pkix.Name{CommonName: fmt.Sprintf("%s@%d", cn, now.Unix())},
		IsCA:     true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		NotAfter: now.Add(caLifetime),
	})
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", name, err)
	}
	if err := writeKeyPair(kp, certPath, keyPath); err != nil {
		return nil, err
	}
	return kp, nil
}

// ensureCert returns the certificate at certPath/keyPath when it is what spec asks for, signed
// by ca (self-signed when ca is nil) and not due for renewal; otherwise it issues and writes a
// new one.
func ensureCert(certPath, keyPath string, ca *controlplane.KeyPair, spec certSpec) (*controlplane.KeyPair, error) {
	if kp, err := loadKeyPair(certPath, keyPath); err == nil && spec.satisfiedBy(kp.Cert, ca) {
		return kp, nil
	}
	kp, err := issue(ca, spec)
	if err != nil {
		return nil, fmt.Errorf("issue %s: %w", filepath.Base(certPath), err)
	}
	if err := writeKeyPair(kp, certPath, keyPath); err != nil {
		return nil, err
	}
	return kp, nil
}

func (s certSpec) satisfiedBy(c *x509.Certificate, ca *controlplane.KeyPair) bool {
	var sigErr error
	if ca != nil {
		sigErr = c.CheckSignatureFrom(ca.Cert)
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
func issue(ca *controlplane.KeyPair, s certSpec) (*controlplane.KeyPair, error) {
	kp, err := controlplane.Issue(ca, controlplane.Template{
		Subject:     pkix.Name{CommonName: s.cn, Organization: s.orgs},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{s.usage},
		DNSNames:    s.dns,
		IPAddresses: s.ips,
		NotAfter:    time.Now().Add(leafLifetime),
	})
	if err != nil {
		return nil, err
	}
	if s.chain && ca != nil {
		kp.CertPEM = append(kp.CertPEM, ca.CertPEM...)
	}
	return kp, nil
}

// writeKubeconfig writes a kubeconfig with the CA and client credentials embedded, named
// "default" throughout as k3s names them.
func writeKubeconfig(path string, mode os.FileMode, server string, caPEM []byte, client *controlplane.KeyPair) error {
	return controlplane.Kubeconfig{Name: "default", User: "default", Server: server, CAPEM: caPEM, Client: client}.Write(path, mode)
}
