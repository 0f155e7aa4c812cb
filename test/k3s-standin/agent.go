package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"kipper.run/kip/test/controlplane"
)

// fatalError is a join failure that waiting will not fix: a wrong token, a server that is not
// the one the token names.
type fatalError struct{ err error }

func (e fatalError) Error() string { return e.err.Error() }
func (e fatalError) Unwrap() error { return e.err }

// joinRetryInterval is how long the agent waits between attempts to reach its server.
const joinRetryInterval = 5 * time.Second

func runAgent(ctx context.Context, o *options, version string) (err error) {
	defer func() {
		if err != nil && ctx.Err() != nil {
			slog.Info("stopped on signal while starting", "err", err)
			err = nil
		}
	}()
	serverURL := strings.TrimSuffix(o.str("server"), "/")
	if serverURL == "" {
		return errors.New("--server is required")
	}
	u, err := url.Parse(serverURL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return fmt.Errorf("only https:// URLs are supported, invalid server URL: %s", serverURL)
	}
	raw, err := o.tokenValue()
	if err != nil {
		return err
	}
	if raw == "" {
		return errors.New("--token is required")
	}
	tok, err := parseToken(raw)
	if err != nil {
		return fmt.Errorf("invalid token: %w", err)
	}
	dataDir, err := filepath.Abs(o.str("data-dir"))
	if err != nil {
		return err
	}
	if err := checkKubelet(o, o.str("standin-bin-dir")); err != nil {
		return err
	}
	n, err := nodeFrom(o, version, dataDir)
	if err != nil {
		return err
	}

	var caPEM []byte
	var creds *nodeCreds
	for {
		caPEM, creds, err = join(ctx, u, tok, n)
		var fatal fatalError
		if err == nil || errors.As(err, &fatal) {
			break
		}
		slog.Info("waiting to join the server", "server", serverURL, "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(joinRetryInterval):
		}
	}
	if err != nil {
		return err
	}
	for _, id := range n.identities(creds) {
		certPath, keyPath := n.credPaths(id.name)
		if err := writeKeyPair(*id.into, certPath, keyPath); err != nil {
			return err
		}
	}
	if err := n.writeCredentials(serverURL, caPEM, creds); err != nil {
		return err
	}
	cl, err := creds.clients(serverURL, caPEM)
	if err != nil {
		return err
	}
	n.setFlannel(serverFlannelBackend(ctx, cl.controller), false)

	sup := newSupervisor()
	bgCtx, stopBackground := context.WithCancel(context.Background())
	var background sync.WaitGroup
	defer func() {
		stopBackground()
		background.Wait()
		_ = sdNotify("STOPPING=1")
		sup.stop(stopTimeout)
	}()
	if err := n.run(ctx, bgCtx, sup, cl, o, func(ctx context.Context) ([]byte, error) { return readClientCA(ctx, cl.kubelet) }, background.Go); err != nil {
		return err
	}
	if err := sdNotify("READY=1"); err != nil {
		slog.Warn(err.Error())
	}
	slog.Info("k3s agent is running", "node", n.name, "server", serverURL)
	return supervise(ctx, sup)
}

// readClientCA reads the CA of client certificates where kube-apiserver publishes it (k3s's agent
// fetches it from its server's supervisor), with the Node's credentials: see bootstrapRBAC.
func readClientCA(ctx context.Context, kube kubernetes.Interface) ([]byte, error) {
	cm, err := kube.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, "extension-apiserver-authentication", metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read the cluster's client CA: %w", err)
	}
	ca := cm.Data["client-ca-file"]
	if ca == "" {
		return nil, errors.New("read the cluster's client CA: kube-system/extension-apiserver-authentication has no client-ca-file")
	}
	return []byte(ca), nil
}

// join checks the server against the token and gets the node's client certificates with it.
func join(ctx context.Context, u *url.URL, tok token, n *node) ([]byte, *nodeCreds, error) {
	caPEM, err := fetchServerCA(ctx, u, tok)
	if err != nil {
		return nil, nil, err
	}
	boot := &rest.Config{
		Host:            u.String(),
		BearerToken:     tok.password,
		TLSClientConfig: rest.TLSClientConfig{CAData: caPEM},
		Timeout:         10 * time.Second,
		UserAgent:       "k3s-standin-agent",
	}
	creds := &nodeCreds{}
	for _, id := range n.identities(creds) {
		if *id.into, err = requestCert(ctx, boot, id); err != nil {
			return nil, nil, err
		}
	}
	return caPEM, creds, nil
}

// fetchServerCA returns the cluster CA the server sends after its serving certificate (k3s's
// agent downloads it from /cacerts; kube-apiserver has no such path), checked against the
// token's CA hash as k3s checks it, and verifies the server's certificate with it.
func fetchServerCA(ctx context.Context, u *url.URL, tok token) ([]byte, error) {
	port := u.Port()
	if port == "" {
		port = "443"
	}
	// Not verified yet: the chain is checked against the token's CA hash below.
	d := &tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true}}
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(u.Hostname(), port))
	if err != nil {
		return nil, err
	}
	certs := conn.(*tls.Conn).ConnectionState().PeerCertificates
	conn.Close()
	if len(certs) < 2 || !certs[len(certs)-1].IsCA {
		return nil, fatalError{fmt.Errorf("the server at %s sent no CA certificate after its own: is it a k3s stand-in server?", u.Host)}
	}
	ca := certs[len(certs)-1]
	caPEM := controlplane.EncodeCert(ca.Raw)
	switch {
	case tok.caHash == "":
		slog.Warn("cluster CA certificate is not validated: the token has no CA hash; use the full token from the server's node-token file")
	case caHash(caPEM) != tok.caHash:
		return nil, fatalError{fmt.Errorf("token CA hash does not match the cluster CA certificate hash: %s != %s", tok.caHash, caHash(caPEM))}
	}
	roots, intermediates := x509.NewCertPool(), x509.NewCertPool()
	roots.AddCert(ca)
	for _, c := range certs[1 : len(certs)-1] {
		intermediates.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: intermediates, DNSName: u.Hostname()}); err != nil {
		return nil, fatalError{fmt.Errorf("verify the server's certificate: %w", err)}
	}
	return caPEM, nil
}

// requestCert gets the certificate of a node identity for a key of its own the way a kubelet
// bootstraps its own: a CertificateSigningRequest for the identity's signer, which the
// controller-manager (the kubelet's, see bootstrapRBAC) or the server (the others, see
// approveAgentCerts) approves, and the controller-manager signs. cfg has the token's credentials.
func requestCert(ctx context.Context, cfg *rest.Config, id nodeIdentity) (*controlplane.KeyPair, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	key, keyPEM, err := controlplane.NewKey()
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: id.spec.cn, Organization: id.spec.orgs},
	}, key)
	if err != nil {
		return nil, fmt.Errorf("create certificate request: %w", err)
	}
	csrs := kube.CertificatesV1().CertificateSigningRequests()
	csr, err := csrs.Create(ctx, &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "node-csr-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: id.signer,
			Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
		},
	}, metav1.CreateOptions{})
	if apierrors.IsUnauthorized(err) {
		return nil, fatalError{fmt.Errorf("the server at %s refused the token: %w", cfg.Host, err)}
	}
	if err != nil {
		return nil, fmt.Errorf("request the certificate %s: %w", id.name, err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		cur, err := csrs.Get(ctx, csr.Name, metav1.GetOptions{})
		if err == nil {
			for _, c := range cur.Status.Conditions {
				if c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed {
					return nil, fatalError{fmt.Errorf("certificate request %s %s: %s", csr.Name, strings.ToLower(string(c.Type)), c.Message)}
				}
			}
			if len(cur.Status.Certificate) > 0 {
				block, _ := pem.Decode(cur.Status.Certificate)
				if block == nil {
					return nil, fmt.Errorf("certificate request %s: no certificate in its status", csr.Name)
				}
				cert, err := x509.ParseCertificate(block.Bytes)
				if err != nil {
					return nil, fmt.Errorf("certificate request %s: %w", csr.Name, err)
				}
				return &controlplane.KeyPair{Cert: cert, CertPEM: cur.Status.Certificate, Key: key, KeyPEM: keyPEM}, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("certificate request %s not signed within a minute (is the server's controller-manager running?)", csr.Name)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}
