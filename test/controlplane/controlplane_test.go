package controlplane

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

func TestIssue(t *testing.T) {
	notAfter := time.Now().Add(time.Hour)
	ca, err := Issue(nil, Template{Subject: pkix.Name{CommonName: "ca"}, IsCA: true, KeyUsage: x509.KeyUsageCertSign, NotAfter: notAfter})
	if err != nil {
		t.Fatal(err)
	}
	if !ca.Cert.IsCA || !ca.Cert.BasicConstraintsValid || ca.Cert.CheckSignatureFrom(ca.Cert) != nil {
		t.Errorf("CA certificate: IsCA %v, basic constraints %v, self-signed %v", ca.Cert.IsCA, ca.Cert.BasicConstraintsValid, ca.Cert.CheckSignatureFrom(ca.Cert))
	}
	leaf, err := Issue(ca, Template{
		Subject:     pkix.Name{CommonName: "leaf", Organization: []string{"system:masters"}},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotAfter:    notAfter,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := leaf.Cert.CheckSignatureFrom(ca.Cert); err != nil {
		t.Errorf("leaf not signed by CA: %v", err)
	}
	if leaf.Cert.IsCA || leaf.Cert.BasicConstraintsValid || !slices.Equal(leaf.Cert.DNSNames, []string{"localhost"}) ||
		!leaf.Cert.NotAfter.Equal(notAfter.Truncate(time.Second)) || time.Since(leaf.Cert.NotBefore) < 59*time.Minute {
		t.Errorf("leaf certificate %+v", leaf.Cert)
	}
}

func TestKubeconfigWrite(t *testing.T) {
	ca, err := Issue(nil, Template{Subject: pkix.Name{CommonName: "ca"}, IsCA: true, KeyUsage: x509.KeyUsageCertSign, NotAfter: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "sub", "admin.kubeconfig")
	if err := (Kubeconfig{Name: "c", User: "u", Server: "https://127.0.0.1:6443", CAPEM: ca.CertPEM, Client: ca}).Write(path, 0o640); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("stat %s: %v, %v", path, fi, err)
	}
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.CurrentContext != "c" || cfg.Contexts["c"].AuthInfo != "u" || cfg.Clusters["c"].Server != "https://127.0.0.1:6443" {
		t.Errorf("kubeconfig %+v", cfg)
	}
}

func TestAPIServerArgsEndpointReconciler(t *testing.T) {
	for addr, want := range map[string]bool{"127.0.0.1": true, "10.0.0.5": false} {
		args := APIServer{AdvertiseAddress: addr}.Args()
		if got := slices.Contains(args, "--endpoint-reconciler-type=none"); got != want {
			t.Errorf("advertise %s: endpoint reconciler off %v, want %v", addr, got, want)
		}
	}
}

func TestProcessStop(t *testing.T) {
	// The shell's child sleeps in the shell's group: Stop must leave nothing of the group.
	p, err := Start("sh", exec.Command("sh", "-c", "sleep 60 & wait"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.Exited() {
		t.Fatal("exited at once")
	}
	if !p.Stop(syscall.SIGTERM, 10*time.Second) {
		t.Fatal("did not stop")
	}
	// An orphan killed with its group may stay a zombie a moment, till init reaps it.
	for deadline := time.Now().Add(5 * time.Second); GroupAlive(p.Pid()); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("process group alive after Stop")
		}
	}
}

func TestPoll(t *testing.T) {
	n := 0
	if err := Poll(context.Background(), time.Millisecond, nil, nil, func(context.Context) error {
		if n++; n < 3 {
			return errors.New("not yet")
		}
		return nil
	}); err != nil || n != 3 {
		t.Errorf("Poll = %v after %d checks", err, n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := Poll(ctx, time.Millisecond, nil, nil, func(context.Context) error { return errors.New("no") })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Poll after deadline = %v", err)
	}
	failed := make(chan struct{})
	close(failed)
	errDead := errors.New("dead")
	if err := Poll(context.Background(), time.Millisecond, failed, func() error { return errDead }, nil); err != errDead {
		t.Errorf("Poll with failed closed = %v", err)
	}
}
