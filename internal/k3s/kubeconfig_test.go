package k3s

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"strings"
	"testing"
	"time"
)

// testCert is a PEM certificate valid until notAfter.
func testCert(t *testing.T, cn string, notAfter time.Time) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, NotBefore: notAfter.Add(-365 * 24 * time.Hour), NotAfter: notAfter}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// k3sYAML is a kubeconfig as k3s writes /etc/rancher/k3s/k3s.yaml.
func k3sYAML(ca, cert []byte, key string) []byte {
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Appendf(nil, `apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: %s
    server: https://127.0.0.1:6443
  name: default
contexts:
- context:
    cluster: default
    user: default
  name: default
current-context: default
kind: Config
preferences: {}
users:
- name: default
  user:
    client-certificate-data: %s
    client-key-data: %s
`, b64(ca), b64(cert), b64([]byte(key)))
}

// TestAdminKubeconfig: the server's admin kubeconfig as kip saves it (pointed at the server's
// address on k3s's port, named after the cluster), and what the upgrade says changed between a
// saved copy and the server's.
func TestAdminKubeconfig(t *testing.T) {
	until := time.Date(2027, 3, 1, 0, 0, 0, 0, time.UTC)
	ca, cert := testCert(t, "k3s-server-ca", until.AddDate(9, 0, 0)), testCert(t, "system:admin", until)
	saved, err := pointKubeconfig(k3sYAML(ca, cert, "key-1"), "prod", "203.0.113.10")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"server: https://203.0.113.10:6443", "current-context: prod", "name: prod"} {
		if !strings.Contains(string(saved), want) {
			t.Errorf("saved kubeconfig lacks %q:\n%s", want, saved)
		}
	}
	if strings.Contains(string(saved), "default") {
		t.Errorf("saved kubeconfig keeps k3s's names:\n%s", saved)
	}
	if got, ok := clientCertExpiry(saved); !ok || !got.Equal(until) {
		t.Errorf("clientCertExpiry = %v, %v; want %v", got, ok, until)
	}
	if _, err := pointKubeconfig([]byte("current-context: nowhere\n"), "prod", "203.0.113.10"); err == nil || !strings.Contains(err.Error(), "no current context") {
		t.Errorf("a k3s.yaml without its context: %v", err)
	}

	renewed := testCert(t, "system:admin", until.AddDate(1, 0, 0))
	otherCA := testCert(t, "k3s-server-ca", until.AddDate(10, 0, 0))
	for _, tc := range []struct {
		name   string
		server []byte
		want   string
	}{
		{"same", k3sYAML(ca, cert, "key-1"), ""},
		{"renewed admin certificate", k3sYAML(ca, renewed, "key-2"), "the admin certificate"},
		{"new key only", k3sYAML(ca, cert, "key-2"), "the admin certificate"},
		{"rotated CA", k3sYAML(otherCA, renewed, "key-2"), "the cluster CA and the admin certificate"},
	} {
		server, err := pointKubeconfig(tc.server, "prod", "203.0.113.10")
		if err != nil {
			t.Fatal(err)
		}
		if got := KubeconfigChange(saved, server); got != tc.want {
			t.Errorf("%s: KubeconfigChange = %q, want %q", tc.name, got, tc.want)
		}
	}
	moved, err := pointKubeconfig(k3sYAML(ca, cert, "key-1"), "prod", "203.0.113.11")
	if err != nil {
		t.Fatal(err)
	}
	if got := KubeconfigChange(saved, moved); got != "its address or names" {
		t.Errorf("another address: KubeconfigChange = %q", got)
	}
	if got := KubeconfigChange(nil, saved); got != "its content" {
		t.Errorf("no saved kubeconfig: KubeconfigChange = %q", got)
	}
	if _, ok := clientCertExpiry([]byte("not yaml: [")); ok {
		t.Error("clientCertExpiry of garbage reported a time")
	}
}

// TestAdminCertWarning: kip warns once its admin certificate is inside k3s's renewal window
// (90 days), and says when it expired once it has.
func TestAdminCertWarning(t *testing.T) {
	now := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	ca := testCert(t, "k3s-server-ca", now.AddDate(9, 0, 0))
	kubeconfig := func(until time.Time) []byte {
		t.Helper()
		out, err := pointKubeconfig(k3sYAML(ca, testCert(t, "system:admin", until), "key"), "prod", "203.0.113.10")
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got := AdminCertWarning(kubeconfig(now.AddDate(0, 0, 91)), now); got != "" {
		t.Errorf("91 days left: %q", got)
	}
	got := AdminCertWarning(kubeconfig(now.AddDate(0, 0, 30)), now)
	for _, want := range []string{"expires on 2027-01-31 (in 30 days)", "sudo systemctl restart k3s", "kip upgrade again"} {
		if !strings.Contains(got, want) {
			t.Errorf("30 days left: %q lacks %q", got, want)
		}
	}
	if got := AdminCertWarning(kubeconfig(now.AddDate(0, 0, -2)), now); !strings.Contains(got, "expired on 2026-12-30") {
		t.Errorf("expired: %q", got)
	}
}
