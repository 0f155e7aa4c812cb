package controlplane

import (
	"net"
	"strconv"
)

// The flags below are what testenv and the k3s stand-in run the control plane with alike: one
// etcd member on loopback without TLS, a kube-apiserver taking client certificates, and a
// controller-manager and scheduler on loopback without leader election. Each caller adds its own
// flags to these (the stand-in lets its *-arg options replace them too).

// ServiceAccountIssuer is the issuer of service-account tokens, and their default audience.
const ServiceAccountIssuer = "https://kubernetes.default.svc.cluster.local"

// Etcd is a single etcd member serving plain HTTP.
type Etcd struct {
	Name      string // of the member, the only one of its initial cluster
	DataDir   string
	ClientURL string // listened on and advertised
	PeerURL   string // listened on and advertised
}

// Args returns etcd's flags.
func (e Etcd) Args() []string {
	return []string{
		"--name=" + e.Name,
		"--data-dir=" + e.DataDir,
		"--listen-client-urls=" + e.ClientURL,
		"--advertise-client-urls=" + e.ClientURL,
		"--listen-peer-urls=" + e.PeerURL,
		"--initial-advertise-peer-urls=" + e.PeerURL,
		"--initial-cluster=" + e.Name + "=" + e.PeerURL,
		"--log-level=warn",
	}
}

// APIServer is a kube-apiserver authenticating clients by certificate, authorizing with the Node
// authorizer and RBAC.
type APIServer struct {
	EtcdURL          string
	BindAddress      string
	AdvertiseAddress string
	SecurePort       int
	CertDir          string // where it would write a self-signed certificate (--cert-dir)
	TLSCertFile      string
	TLSKeyFile       string
	ClientCAFile     string
	// ServiceAccountKeyFile verifies service-account tokens; ServiceAccountSigningKeyFile signs
	// them.
	ServiceAccountKeyFile        string
	ServiceAccountSigningKeyFile string
	ServiceCIDR                  string
}

// Args returns kube-apiserver's flags.
func (a APIServer) Args() []string {
	args := []string{
		"--etcd-servers=" + a.EtcdURL,
		"--bind-address=" + a.BindAddress,
		"--advertise-address=" + a.AdvertiseAddress,
	}
	if ip := net.ParseIP(a.AdvertiseAddress); ip != nil && ip.IsLoopback() {
		// The endpoint reconciler refuses a loopback address: default/kubernetes has no endpoints.
		args = append(args, "--endpoint-reconciler-type=none")
	}
	return append(args,
		"--secure-port="+strconv.Itoa(a.SecurePort),
		"--cert-dir="+a.CertDir,
		"--tls-cert-file="+a.TLSCertFile,
		"--tls-private-key-file="+a.TLSKeyFile,
		"--client-ca-file="+a.ClientCAFile,
		"--service-account-key-file="+a.ServiceAccountKeyFile,
		"--service-account-signing-key-file="+a.ServiceAccountSigningKeyFile,
		"--service-account-issuer="+ServiceAccountIssuer,
		"--api-audiences="+ServiceAccountIssuer,
		"--service-cluster-ip-range="+a.ServiceCIDR,
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true",
		"--profiling=false",
	)
}

// ControllerManager is a kube-controller-manager on loopback running every default controller,
// each with its own service account.
type ControllerManager struct {
	Kubeconfig            string
	SecurePort            int
	CertDir               string
	ServiceAccountKeyFile string // signs the controllers' tokens (--service-account-private-key-file)
	RootCAFile            string // put in service accounts' ca.crt
	ServiceCIDR           string
}

// Args returns kube-controller-manager's flags.
func (c ControllerManager) Args() []string {
	return []string{
		"--kubeconfig=" + c.Kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(c.SecurePort),
		"--cert-dir=" + c.CertDir,
		"--leader-elect=false",
		"--controllers=*",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + c.ServiceAccountKeyFile,
		"--root-ca-file=" + c.RootCAFile,
		"--service-cluster-ip-range=" + c.ServiceCIDR,
		"--profiling=false",
	}
}

// Scheduler is a kube-scheduler on loopback.
type Scheduler struct {
	Kubeconfig string
	SecurePort int
	CertDir    string
}

// Args returns kube-scheduler's flags.
func (s Scheduler) Args() []string {
	return []string{
		"--kubeconfig=" + s.Kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(s.SecurePort),
		"--cert-dir=" + s.CertDir,
		"--leader-elect=false",
		"--profiling=false",
	}
}
