package k3s

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"kipper.run/kip/internal/sshx"
)

// ErrNoKubeconfig is AdminKubeconfig's answer before k3s has written its admin kubeconfig.
var ErrNoKubeconfig = errors.New(KubeconfigPath + " does not exist yet: k3s has not started on the server")

// AdminKubeconfig reads k3s's admin kubeconfig on the server and returns it as kip saves it:
// the cluster's CA and the admin's credentials as k3s wrote them, pointed at address (on the
// port k3s names), its cluster, user and context named name. Install saves it; every upgrade
// compares the saved copy with it, which is how kip follows k3s's renewal of its certificates.
func AdminKubeconfig(ctx context.Context, c *sshx.Client, name, address string) ([]byte, error) {
	const absent = 3
	res, err := c.Probe(ctx, fmt.Sprintf("if [ -f %[1]s ]; then cat %[1]s; else exit %d; fi", sshx.Quote(KubeconfigPath), absent))
	if err != nil {
		return nil, err
	}
	if res.ExitStatus == absent {
		return nil, ErrNoKubeconfig
	}
	if err := res.Err(); err != nil {
		return nil, fmt.Errorf("read %s on the server: %w", KubeconfigPath, err)
	}
	return pointKubeconfig(res.Stdout, name, address)
}

// pointKubeconfig is AdminKubeconfig's rewrite of k3s.yaml's content.
func pointKubeconfig(raw []byte, name, address string) ([]byte, error) {
	c, err := current(raw)
	if err != nil {
		return nil, fmt.Errorf("%s on the server: %w", KubeconfigPath, err)
	}
	cluster, user := c.cluster, c.user
	_, port, err := net.SplitHostPort(strings.TrimPrefix(cluster.Server, "https://"))
	if err != nil {
		port = "6443"
	}
	cluster.Server = "https://" + net.JoinHostPort(address, port)
	out := clientcmdapi.NewConfig()
	out.Clusters[name] = cluster
	out.AuthInfos[name] = user
	out.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	out.CurrentContext = name
	return clientcmd.Write(*out)
}

// KubeconfigChange says how a saved kubeconfig differs from the server's (AdminKubeconfig's):
// the cluster CA it trusts, the admin certificate it presents, or something else ("" when
// they are the same). Either file failing to parse counts as a change of everything.
func KubeconfigChange(saved, server []byte) string {
	if string(saved) == string(server) {
		return ""
	}
	s, errS := current(saved)
	h, errH := current(server)
	if errS != nil || errH != nil {
		return "its content"
	}
	var parts []string
	if string(s.cluster.CertificateAuthorityData) != string(h.cluster.CertificateAuthorityData) {
		parts = append(parts, "the cluster CA")
	}
	if string(s.user.ClientCertificateData) != string(h.user.ClientCertificateData) || string(s.user.ClientKeyData) != string(h.user.ClientKeyData) {
		parts = append(parts, "the admin certificate")
	}
	if len(parts) == 0 {
		return "its address or names"
	}
	return strings.Join(parts, " and ")
}

// clientCertExpiry is when the certificate a kubeconfig presents stops being valid; ok is false
// when it presents none that parses.
func clientCertExpiry(kubeconfig []byte) (t time.Time, ok bool) {
	c, err := current(kubeconfig)
	if err != nil {
		return time.Time{}, false
	}
	block, _ := pem.Decode(c.user.ClientCertificateData)
	if block == nil {
		return time.Time{}, false
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return time.Time{}, false
	}
	return cert.NotAfter, true
}

type currentContext struct {
	cluster *clientcmdapi.Cluster
	user    *clientcmdapi.AuthInfo
}

// current is a kubeconfig's current context's cluster and user.
func current(kubeconfig []byte) (currentContext, error) {
	cfg, err := clientcmd.Load(kubeconfig)
	if err != nil {
		return currentContext{}, fmt.Errorf("parse it: %w", err)
	}
	kc, ok := cfg.Contexts[cfg.CurrentContext]
	if !ok {
		return currentContext{}, errors.New("it has no current context")
	}
	if cfg.Clusters[kc.Cluster] == nil || cfg.AuthInfos[kc.AuthInfo] == nil {
		return currentContext{}, errors.New("its current context lacks its cluster or user")
	}
	return currentContext{cfg.Clusters[kc.Cluster], cfg.AuthInfos[kc.AuthInfo]}, nil
}

// certRenewWindow is how close to its expiry k3s renews a certificate when it starts (k3s's
// documentation, "Certificate Management": client and server certificates live 365 days and
// are renewed on a start within 90 days of expiring). AdminCertWarning warns from then
// on.
const certRenewWindow = 90 * 24 * time.Hour

// AdminCertWarning says when the admin certificate of kubeconfig is within k3s's renewal window
// (or past it), "" when it is not.
func AdminCertWarning(kubeconfig []byte, now time.Time) string {
	until, ok := clientCertExpiry(kubeconfig)
	if !ok || until.Sub(now) >= certRenewWindow {
		return ""
	}
	when := "expired on " + until.UTC().Format(time.DateOnly)
	if until.After(now) {
		when = fmt.Sprintf("expires on %s (in %d days)", until.UTC().Format(time.DateOnly), int(until.Sub(now).Hours()/24))
	}
	return "kip's admin certificate for this cluster " + when + ". k3s renews it when it starts within 90 days of its expiry, and the next kip upgrade saves the renewed one: restart k3s on the server (sudo systemctl restart k3s), then run kip upgrade again"
}
