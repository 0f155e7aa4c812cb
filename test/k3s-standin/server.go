package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsclientset "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"kipper.run/kip/test/controlplane"
	"kipper.run/kip/test/helmstandin"
)

// nodeMonitorGracePeriod is the controller-manager's --node-monitor-grace-period: how long after
// a stand-in stops renewing its Node's Lease the Node turns NotReady. Kubernetes' default is 50 s;
// the stand-in shortens it so that tests see a stopped agent sooner. kube-controller-manager-arg
// can set it back.
const nodeMonitorGracePeriod = "20s"

// serverPaths are where k3s keeps a server's state under its data directory.
type serverPaths struct {
	server, tls, cred, etcd string
}

func newServerPaths(dataDir string) serverPaths {
	server := filepath.Join(dataDir, "server")
	return serverPaths{
		server: server,
		tls:    filepath.Join(server, "tls"),
		cred:   filepath.Join(server, "cred"),
		etcd:   filepath.Join(server, "db", "etcd"),
	}
}

// serverPKI is the cluster's certificate authorities and the credentials issued from them, kept
// in server/tls across restarts so that kubeconfigs and agents stay valid.
type serverPKI struct {
	serverCA, clientCA           *controlplane.KeyPair
	admin, controller, scheduler *controlplane.KeyPair
}

// serverConfig is a server's settings, resolved from its options.
type serverConfig struct {
	o                                        *options
	paths                                    serverPaths
	binDir                                   string
	node                                     *node
	httpsPort                                int
	etcdPort, etcdPeerPort, kcmPort, schPort int
	serviceNet                               *net.IPNet
	bind, advertise                          string
	localURL                                 string // how k3s.yaml and the components reach kube-apiserver
	kubeconfigMode                           os.FileMode
	sans                                     certSpec
}

func newServerConfig(o *options, version string) (*serverConfig, error) {
	dataDir, err := filepath.Abs(o.str("data-dir"))
	if err != nil {
		return nil, err
	}
	c := &serverConfig{o: o, paths: newServerPaths(dataDir), binDir: o.str("standin-bin-dir")}
	if err := checkFiles(c.binDir, "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"); err != nil {
		return nil, err
	}
	if err := checkKubelet(o, c.binDir); err != nil {
		return nil, err
	}
	if c.node, err = nodeFrom(o, version, dataDir); err != nil {
		return nil, err
	}
	c.node.setFlannel(o.str("flannel-backend"), o.boolean("flannel-external-ip"))
	if c.httpsPort, err = o.integer("https-listen-port"); err != nil {
		return nil, err
	}
	base, err := o.integer("standin-port-base")
	if err != nil {
		return nil, err
	}
	c.etcdPort, c.etcdPeerPort, c.kcmPort, c.schPort = 2379, 2380, 10257, 10259
	if base != 0 {
		c.etcdPort, c.etcdPeerPort, c.kcmPort, c.schPort = base, base+1, base+2, base+3
	}
	if _, c.serviceNet, err = net.ParseCIDR(o.str("service-cidr")); err != nil {
		return nil, fmt.Errorf("invalid service-cidr: %w", err)
	}
	if _, _, err := net.ParseCIDR(o.str("cluster-cidr")); err != nil {
		return nil, fmt.Errorf("invalid cluster-cidr: %w", err)
	}
	c.bind = o.str("bind-address")
	bindIP := net.ParseIP(c.bind)
	if bindIP == nil {
		return nil, fmt.Errorf("invalid bind-address %q", c.bind)
	}
	localHost := "127.0.0.1" // unless kube-apiserver is bound to one address
	if !bindIP.IsUnspecified() {
		localHost = c.bind
	}
	c.localURL = "https://" + net.JoinHostPort(localHost, strconv.Itoa(c.httpsPort))
	c.advertise = o.str("advertise-address")
	if c.advertise == "" {
		c.advertise = c.node.internalIPs[0]
	}
	advertiseIP := net.ParseIP(c.advertise)
	if advertiseIP == nil {
		return nil, fmt.Errorf("invalid advertise-address %q", c.advertise)
	}
	if c.kubeconfigMode, err = kubeconfigMode(o.str("write-kubeconfig-mode")); err != nil {
		return nil, err
	}
	c.sans = servingSANs(c.node, o.list("tls-san"), firstIP(c.serviceNet), advertiseIP, bindIP)
	return c, nil
}

func (c *serverConfig) tls(name string) string  { return filepath.Join(c.paths.tls, name) }
func (c *serverConfig) cred(name string) string { return filepath.Join(c.paths.cred, name) }
func (c *serverConfig) bin(name string) string  { return filepath.Join(c.binDir, name) }

func (c *serverConfig) etcdURL() string {
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(c.etcdPort))
}

func (c *serverConfig) etcdArgs() []string {
	base := controlplane.Etcd{
		Name:      "k3s-standin",
		DataDir:   c.paths.etcd,
		ClientURL: c.etcdURL(),
		PeerURL:   "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(c.etcdPeerPort)),
	}
	return componentArgs(withBase(base.Args(), nil), c.o.list("etcd-arg"))
}

// tokenAuthFile is kube-apiserver's --token-auth-file, which lets agents in with the token.
func (c *serverConfig) tokenAuthFile() string { return c.cred("standin-token-auth.csv") }

// serviceAccountKey signs and verifies service-account tokens.
func (c *serverConfig) serviceAccountKey() string { return c.tls("service.key") }

func (c *serverConfig) apiserverArgs() []string {
	base := controlplane.APIServer{
		EtcdURL:                      c.etcdURL(),
		BindAddress:                  c.bind,
		AdvertiseAddress:             c.advertise, // a loopback one turns the endpoint reconciler off
		SecurePort:                   c.httpsPort,
		CertDir:                      c.tls("temporary-certs"),
		TLSCertFile:                  c.tls("serving-kube-apiserver.crt"),
		TLSKeyFile:                   c.tls("serving-kube-apiserver.key"),
		ClientCAFile:                 c.tls("client-ca.crt"),
		ServiceAccountKeyFile:        c.serviceAccountKey(),
		ServiceAccountSigningKeyFile: c.serviceAccountKey(),
		ServiceCIDR:                  c.serviceNet.String(),
	}
	return componentArgs(withBase(base.Args(), map[string]string{
		"anonymous-auth":             "false",
		"api-audiences":              controlplane.ServiceAccountIssuer + ",k3s",
		"kubelet-client-certificate": c.tls("client-kube-apiserver.crt"),
		"kubelet-client-key":         c.tls("client-kube-apiserver.key"),
		// As k3s sets it (pkg/daemons/control/server.go): the API server reaches each kubelet at
		// its node's address, not at its host name.
		"kubelet-preferred-address-types": c.kubeletAddressTypes(),
		"service-node-port-range":         c.o.str("service-node-port-range"),
		"token-auth-file":                 c.tokenAuthFile(),
	}), c.o.list("kube-apiserver-arg"))
}

// kubeletAddressTypes is the order in which the API server tries a node's addresses to reach its
// kubelet: k3s's, the external address first with flannel-external-ip.
func (c *serverConfig) kubeletAddressTypes() string {
	if c.o.boolean("flannel-external-ip") {
		return "ExternalIP,InternalIP,Hostname"
	}
	return "InternalIP,ExternalIP,Hostname"
}

func (c *serverConfig) controllerManagerArgs() []string {
	base := controlplane.ControllerManager{
		Kubeconfig:            c.cred("controller.kubeconfig"),
		SecurePort:            c.kcmPort,
		CertDir:               c.tls("temporary-certs"),
		ServiceAccountKeyFile: c.serviceAccountKey(),
		RootCAFile:            c.tls("server-ca.crt"),
		ServiceCIDR:           c.serviceNet.String(),
	}
	// As k3s: client certificates signed by the client CA, serving ones by the server CA.
	return componentArgs(withBase(base.Args(), map[string]string{
		"allocate-node-cidrs":                             "true",
		"authentication-kubeconfig":                       c.cred("controller.kubeconfig"),
		"authorization-kubeconfig":                        c.cred("controller.kubeconfig"),
		"cluster-cidr":                                    c.o.str("cluster-cidr"),
		"cluster-signing-kube-apiserver-client-cert-file": c.tls("client-ca.crt"),
		"cluster-signing-kube-apiserver-client-key-file":  c.tls("client-ca.key"),
		"cluster-signing-kubelet-client-cert-file":        c.tls("client-ca.crt"),
		"cluster-signing-kubelet-client-key-file":         c.tls("client-ca.key"),
		"cluster-signing-kubelet-serving-cert-file":       c.tls("server-ca.crt"),
		"cluster-signing-kubelet-serving-key-file":        c.tls("server-ca.key"),
		"cluster-signing-legacy-unknown-cert-file":        c.tls("server-ca.crt"),
		"cluster-signing-legacy-unknown-key-file":         c.tls("server-ca.key"),
		"configure-cloud-routes":                          "false",
		"controllers":                                     "*,tokencleaner",
		"node-cidr-mask-size":                             "24",
		"node-monitor-grace-period":                       nodeMonitorGracePeriod,
	}), c.o.list("kube-controller-manager-arg"))
}

func (c *serverConfig) schedulerArgs() []string {
	base := controlplane.Scheduler{
		Kubeconfig: c.cred("scheduler.kubeconfig"),
		SecurePort: c.schPort,
		CertDir:    c.tls("temporary-certs"),
	}
	return componentArgs(withBase(base.Args(), map[string]string{
		"authentication-kubeconfig": c.cred("scheduler.kubeconfig"),
		"authorization-kubeconfig":  c.cred("scheduler.kubeconfig"),
	}), c.o.list("kube-scheduler-arg"))
}

// prepare writes what the control plane reads before it starts: directories, certificates,
// token files and the components' kubeconfigs.
func (c *serverConfig) prepare() (*serverPKI, error) {
	if err := os.MkdirAll(filepath.Dir(c.paths.server), 0o755); err != nil {
		return nil, fmt.Errorf("create data directory: %w", err)
	}
	for _, d := range []string{c.paths.server, c.paths.tls, c.paths.cred} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("create %s: %w", d, err)
		}
	}
	pk, err := ensureServerPKI(c.paths, c.sans, c.serviceAccountKey())
	if err != nil {
		return nil, err
	}
	tok, err := serverToken(c.o, filepath.Join(c.paths.server, "token"), pk.serverCA.CertPEM)
	if err != nil {
		return nil, err
	}
	if err := writeTokenFiles(c.paths.server, c.tokenAuthFile(), tok, pk.serverCA.CertPEM); err != nil {
		return nil, err
	}
	for name, kp := range map[string]*controlplane.KeyPair{"admin": pk.admin, "controller": pk.controller, "scheduler": pk.scheduler} {
		if err := writeKubeconfig(c.cred(name+".kubeconfig"), 0o600, c.localURL, pk.serverCA.CertPEM, kp); err != nil {
			return nil, err
		}
	}
	return pk, nil
}

func runServer(ctx context.Context, o *options, version string) (err error) {
	began := time.Now()
	c, err := newServerConfig(o, version)
	if err != nil {
		return err
	}
	pk, err := c.prepare()
	if err != nil {
		return err
	}
	sup := newSupervisor()
	// The Node's heartbeat and the helm-controller run until the stand-in stops.
	bgCtx, stopBackground := context.WithCancel(context.Background())
	var background sync.WaitGroup
	defer func() {
		stopBackground()
		background.Wait()
		_ = sdNotify("STOPPING=1")
		sup.stop(stopTimeout)
		if err != nil && ctx.Err() != nil {
			slog.Info("stopped on signal while starting", "err", err)
			err = nil // asked to stop, as systemd does when a start is cancelled: a clean exit
		}
	}()

	if err := sup.start("etcd", c.bin("etcd"), c.etcdArgs(), childEnv(), nil); err != nil {
		return err
	}
	plain := &http.Client{Timeout: 2 * time.Second}
	if err := waitFor(ctx, sup, "etcd", 2*time.Minute, func(ctx context.Context) error {
		return controlplane.HTTPOK(ctx, plain, c.etcdURL()+"/health", `"health":"true"`)
	}); err != nil {
		return err
	}
	if err := sup.start("kube-apiserver", c.bin("kube-apiserver"), c.apiserverArgs(), childEnv(), nil); err != nil {
		return err
	}
	adminCfg := restConfig(c.localURL, pk.serverCA.CertPEM, pk.admin)
	admin, err := kubernetes.NewForConfig(adminCfg)
	if err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	if err := waitFor(ctx, sup, "kube-apiserver", 5*time.Minute, func(ctx context.Context) error {
		return controlplane.APIServerReady(ctx, admin)
	}); err != nil {
		return err
	}
	slog.Info("kube-apiserver is ready", "url", c.localURL, "after", time.Since(began).Round(time.Millisecond))
	if err := sup.start("kube-controller-manager", c.bin("kube-controller-manager"), c.controllerManagerArgs(), childEnv(), nil); err != nil {
		return err
	}
	if err := sup.start("kube-scheduler", c.bin("kube-scheduler"), c.schedulerArgs(), childEnv(), nil); err != nil {
		return err
	}
	if err := bootstrapRBAC(ctx, admin); err != nil {
		return err
	}
	helm, err := deployAddons(ctx, sup, c, adminCfg, admin)
	if err != nil {
		return err
	}
	background.Go(func() { helm.Run(bgCtx) })
	background.Go(func() { runCloudController(bgCtx, admin) })
	background.Go(func() { approveAgentCerts(bgCtx, admin) })
	if err := writeKubeconfig(o.str("write-kubeconfig"), c.kubeconfigMode, c.localURL, pk.serverCA.CertPEM, pk.admin); err != nil {
		return err
	}

	// The server's own Node, kept as a kubelet would with a system:node client certificate, its
	// other components with certificates of their own, as an agent's.
	n := c.node
	creds, err := n.issueCredentials(pk.clientCA)
	if err != nil {
		return err
	}
	if err := n.writeCredentials(c.localURL, pk.serverCA.CertPEM, creds); err != nil {
		return err
	}
	cl, err := creds.clients(c.localURL, pk.serverCA.CertPEM)
	if err != nil {
		return err
	}
	clientCA := func(context.Context) ([]byte, error) { return pk.clientCA.CertPEM, nil }
	if err := n.run(ctx, bgCtx, sup, cl, o, clientCA, background.Go); err != nil {
		return err
	}
	if err := labelControlPlane(ctx, admin, n.name, o.boolean("cluster-init")); err != nil {
		return err
	}
	if err := sdNotify("READY=1"); err != nil {
		slog.Warn(err.Error())
	}
	slog.Info("k3s is up and running", "node", n.name, "after", time.Since(began).Round(time.Millisecond))
	return supervise(ctx, sup)
}

// deployAddons does what k3s does for its add-ons before the stand-in reports ready: it creates
// helm-controller's CRDs and waits until they are Established, and deploys the packaged CoreDNS
// and local-storage manifests unless they are disabled. It returns the helm-controller to run.
func deployAddons(ctx context.Context, sup *supervisor, c *serverConfig, adminCfg *rest.Config, admin kubernetes.Interface) (*helmstandin.Controller, error) {
	ext, err := apiextensionsclientset.NewForConfig(adminCfg)
	if err != nil {
		return nil, fmt.Errorf("admin client: %w", err)
	}
	names, err := helmstandin.EnsureCRDs(ctx, ext)
	if err != nil {
		return nil, err
	}
	if err := waitFor(ctx, sup, "helm-controller's CRDs", time.Minute, func(ctx context.Context) error {
		return helmstandin.CRDsEstablished(ctx, ext, names)
	}); err != nil {
		return nil, err
	}
	// It logs to stderr with the prefix "helm", as the stand-in's children do.
	helm, err := helmstandin.New(adminCfg, filepath.Join(c.paths.server, "standin-charts"),
		slog.New(slog.NewTextHandler(&prefixWriter{prefix: "helm"}, nil)))
	if err != nil {
		return nil, err
	}
	vars := map[string]string{
		"CLUSTER_DNS":                clusterDNS,
		"CLUSTER_DOMAIN":             clusterDomain,
		"DEFAULT_LOCAL_STORAGE_PATH": defaultLocalStoragePath,
		"NODE_HOSTS":                 c.node.internalIPs[0] + " " + c.node.name,
	}
	if err := deployPackaged(ctx, helm.Applier(), c.o.list("disable"), vars); err != nil {
		return nil, err
	}
	return helm, nil
}

// supervise waits for a signal (a clean stop) or a child's end (a failure).
func supervise(ctx context.Context, sup *supervisor) error {
	select {
	case <-ctx.Done():
		slog.Info("stopping on signal")
		return nil
	case <-sup.failed:
		return sup.failure
	}
}

// ensureServerPKI loads or creates the server's certificates and its service-account key saKey.
func ensureServerPKI(p serverPaths, sans certSpec, saKey string) (*serverPKI, error) {
	pk := &serverPKI{}
	var err error
	if pk.serverCA, err = ensureCA(p.tls, "server-ca", "k3s-server-ca"); err != nil {
		return nil, err
	}
	if pk.clientCA, err = ensureCA(p.tls, "client-ca", "k3s-client-ca"); err != nil {
		return nil, err
	}
	sans.cn, sans.usage, sans.chain = "kube-apiserver", x509.ExtKeyUsageServerAuth, true
	leaves := []struct {
		into **controlplane.KeyPair
		name string
		ca   *controlplane.KeyPair
		spec certSpec
	}{
		{nil, "serving-kube-apiserver", pk.serverCA, sans},
		{&pk.admin, "client-admin", pk.clientCA, certSpec{cn: "system:admin", orgs: []string{"system:masters"}, usage: x509.ExtKeyUsageClientAuth}},
		{&pk.controller, "client-controller", pk.clientCA, certSpec{cn: "system:kube-controller-manager", usage: x509.ExtKeyUsageClientAuth}},
		{&pk.scheduler, "client-scheduler", pk.clientCA, certSpec{cn: "system:kube-scheduler", usage: x509.ExtKeyUsageClientAuth}},
		// kube-apiserver's client certificate for kubelets (here kwok's kubelet endpoint).
		{nil, "client-kube-apiserver", pk.clientCA, certSpec{cn: "system:apiserver", orgs: []string{"system:masters"}, usage: x509.ExtKeyUsageClientAuth}},
	}
	for _, l := range leaves {
		kp, err := ensureCert(filepath.Join(p.tls, l.name+".crt"), filepath.Join(p.tls, l.name+".key"), l.ca, l.spec)
		if err != nil {
			return nil, err
		}
		if l.into != nil {
			*l.into = kp
		}
	}
	if _, err := os.Stat(saKey); errors.Is(err, os.ErrNotExist) {
		_, keyPEM, err := controlplane.NewKey()
		if err != nil {
			return nil, err
		}
		if err := controlplane.WriteFile(saKey, keyPEM, 0o600); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, fmt.Errorf("read service-account key: %w", err)
	}
	return pk, nil
}

// servingSANs are the names and addresses kube-apiserver's certificate covers, as k3s's: the
// in-cluster names, loopback, the first Service IP, the node's addresses, the advertised and
// bound addresses, the hostname and every tls-san.
func servingSANs(n *node, tlsSANs []string, serviceIP, advertise, bind net.IP) certSpec {
	s := certSpec{
		dns: []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost", n.hostname, n.name},
		ips: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, serviceIP, advertise},
	}
	if !bind.IsUnspecified() {
		s.ips = append(s.ips, bind)
	}
	for _, a := range append(append(append([]string(nil), n.internalIPs...), n.externalIPs...), tlsSANs...) {
		if ip := net.ParseIP(a); ip != nil {
			s.ips = append(s.ips, ip)
		} else {
			s.dns = append(s.dns, a)
		}
	}
	s.dns = slices.Compact(slices.Sorted(slices.Values(s.dns)))
	s.ips = slices.CompactFunc(s.ips, net.IP.Equal)
	return s
}

func firstIP(n *net.IPNet) net.IP {
	ip := slices.Clone(n.IP.To16())
	ip[len(ip)-1]++
	return ip
}

func kubeconfigMode(s string) (os.FileMode, error) {
	if s == "" {
		return 0o600, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o777 {
		return 0, fmt.Errorf("invalid write-kubeconfig-mode %q: want an octal mode like 0644", s)
	}
	return os.FileMode(m), nil
}

// componentArgs returns defaults with extra (key=value items of a *-arg flag; a bare key means
// true) replacing the defaults of the same key, as sorted --key=value arguments, as k3s passes
// them.
func componentArgs(defaults map[string]string, extra []string) []string {
	m := map[string]string{}
	maps.Copy(m, defaults)
	setFlags(m, extra)
	args := make([]string, 0, len(m))
	for k, v := range m {
		args = append(args, "--"+k+"="+v)
	}
	sort.Strings(args)
	return args
}

// setFlags sets m's entries from args, --key=value or key=value items (a bare key means true).
func setFlags(m map[string]string, args []string) {
	for _, a := range args {
		k, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !ok {
			v = "true"
		}
		m[k] = v
	}
}

// withBase returns the flags of base (controlplane's, --key=value) with own added to or
// replacing them, for componentArgs.
func withBase(base []string, own map[string]string) map[string]string {
	m := map[string]string{}
	setFlags(m, base)
	maps.Copy(m, own)
	return m
}

func restConfig(server string, caPEM []byte, client *controlplane.KeyPair) *rest.Config {
	cfg := controlplane.RESTConfig(server, caPEM, client)
	cfg.Timeout = 30 * time.Second
	cfg.UserAgent = "k3s-standin"
	return cfg
}

// errStopped means a signal asked the stand-in to stop while it was starting.
var errStopped = errors.New("stopped by signal")

// waitFor polls check until it succeeds, timeout passes, a signal arrives (errStopped) or a
// child ends.
func waitFor(ctx context.Context, sup *supervisor, what string, timeout time.Duration, check func(context.Context) error) error {
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := controlplane.Poll(tctx, 100*time.Millisecond, sup.failed, func() error { return sup.failure }, check)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return errStopped
	case tctx.Err() != nil:
		return fmt.Errorf("%s not ready after %s: %w", what, timeout, err)
	}
	return err
}

// k3sControllerRules are the rules of k3s's ClusterRole system:k3s-controller (its
// manifests/rolebindings.yaml since v1.32): flannel and k3s's network policy controller watch
// every Node, Namespace, NetworkPolicy, Pod and Endpoints, and flannel patches Nodes' status.
var k3sControllerRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch"}},
	{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"endpoints", "pods"}, Verbs: []string{"list", "get", "watch"}},
}

// bootstrapRBAC creates, at every start, the roles and bindings the nodes' credentials (see
// nodeIdentity) need beyond Kubernetes' own: k3s's system:k3s-controller; the bindings that let
// the token's user (see writeTokenFiles) request node client certificates and have the kubelet's
// approved by the controller-manager, as kubeadm's bootstrap-token bindings do (the stand-in's
// way to what k3s's supervisor hands agents for the token); system:k3s-controller for kwokGroup.
// kube-proxy needs none: Kubernetes binds system:node-proxier to system:kube-proxy. It deletes
// what earlier stand-ins bound to group system:nodes (every Node could list Nodes and act as
// kube-proxy), so that a server upgraded in place keeps none of it.
func bootstrapRBAC(ctx context.Context, admin kubernetes.Interface) error {
	rbac := admin.RbacV1()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "system:k3s-controller"}, Rules: k3sControllerRules}
	if err := createOrUpdate(ctx, role, rbac.ClusterRoles().Create, rbac.ClusterRoles().Update); err != nil {
		return fmt.Errorf("create cluster role %s: %w", role.Name, err)
	}
	bindings := []struct{ name, role, kind, subject string }{
		{"system:k3s-controller", role.Name, rbacv1.UserKind, "system:k3s-controller"},
		{"k3s-standin-node-bootstrapper", "system:node-bootstrapper", rbacv1.GroupKind, bootstrapGroup},
		{"k3s-standin-node-autoapprove", "system:certificates.k8s.io:certificatesigningrequests:nodeclient", rbacv1.GroupKind, bootstrapGroup},
		{"k3s-standin-kwok", role.Name, rbacv1.GroupKind, kwokGroup},
	}
	for _, b := range bindings {
		crb := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: b.name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: b.role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: b.kind, Name: b.subject}},
		}
		if err := createOrUpdate(ctx, crb, rbac.ClusterRoleBindings().Create, rbac.ClusterRoleBindings().Update); err != nil {
			return fmt.Errorf("bind %s to %s: %w", b.role, b.subject, err)
		}
	}
	// An agent's kubelet checks the API server's client certificate against the client CA. A real
	// kubelet reads no ConfigMap for it (k3s's agent fetches the CA from its server's supervisor),
	// but the stand-in's agent reads it where kube-apiserver publishes it, with the Node's
	// credentials (readClientCA): this is all the Node's credentials may do beyond a kubelet's.
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "k3s-standin-node-client-ca", Namespace: metav1.NamespaceSystem},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "extension-apiserver-authentication-reader"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "system:nodes"}},
	}
	if err := createOrUpdate(ctx, rb, rbac.RoleBindings(rb.Namespace).Create, rbac.RoleBindings(rb.Namespace).Update); err != nil {
		return fmt.Errorf("bind %s to system:nodes: %w", rb.RoleRef.Name, err)
	}
	for _, name := range []string{"k3s-standin-node-reader", "k3s-standin-node-proxier"} {
		if err := rbac.ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete cluster role binding %s: %w", name, err)
		}
	}
	if err := rbac.ClusterRoles().Delete(ctx, "k3s-standin-node-reader", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete cluster role k3s-standin-node-reader: %w", err)
	}
	return nil
}

// createOrUpdate creates obj, or updates it when it exists.
func createOrUpdate[T any](ctx context.Context, obj T,
	create func(context.Context, T, metav1.CreateOptions) (T, error), update func(context.Context, T, metav1.UpdateOptions) (T, error)) error {
	_, err := create(ctx, obj, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		_, err = update(ctx, obj, metav1.UpdateOptions{})
	}
	return err
}

// labelControlPlane adds the role labels k3s's server puts on its Node (a kubelet may not set
// them on itself).
func labelControlPlane(ctx context.Context, admin kubernetes.Interface, name string, etcd bool) error {
	labels := map[string]string{
		"node-role.kubernetes.io/control-plane": "true",
		"node-role.kubernetes.io/master":        "true",
	}
	if etcd {
		labels["node-role.kubernetes.io/etcd"] = "true"
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	if err != nil {
		return fmt.Errorf("encode labels: %w", err)
	}
	if _, err := admin.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("label node %s: %w", name, err)
	}
	return nil
}

// serverFlannelBackend is the flannel-backend setting of the backend the servers' Nodes record,
// which k3s agents take from their server. kube lists Nodes: it has k3s-controller's credentials.
func serverFlannelBackend(ctx context.Context, kube kubernetes.Interface) string {
	nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "node-role.kubernetes.io/control-plane=true"})
	if err != nil {
		slog.Warn("read the server's flannel backend; assuming vxlan", "err", err)
		return "vxlan"
	}
	for _, nd := range nodes.Items {
		if b := nd.Annotations["flannel.alpha.coreos.com/backend-type"]; b != "" {
			return k3sBackend(b)
		}
	}
	if len(nodes.Items) > 0 {
		return "none"
	}
	return "vxlan"
}
