package k3s

import (
	"fmt"
	"net"
	"strconv"

	"sigs.k8s.io/yaml"
)

// Paths k3s and kip use on a server.
const (
	ConfigPath       = "/etc/rancher/k3s/config.yaml"
	ConfigBackupPath = ConfigPath + BackupSuffix
	KubeconfigPath   = "/etc/rancher/k3s/k3s.yaml"
	AuditPolicyPath  = "/var/lib/rancher/k3s/server/kipper-audit-policy.yaml"
	AuditLogPath     = "/var/lib/rancher/k3s/server/logs/audit.log"
	// AuthenticationConfigPath is the API server's structured authentication configuration: the
	// operators' login through Dex.
	AuthenticationConfigPath = "/etc/rancher/k3s/kipper-authentication.yaml"
)

// BackupSuffix names the copy kip keeps of a file it rewrites on a server, beside it: the
// previous config.yaml is config.yaml.kipper-bak.
const BackupSuffix = ".kipper-bak"

// Flannel backends: WireGuard when the server can load the module, VXLAN otherwise.
const (
	FlannelWireGuard = "wireguard-native"
	FlannelVXLAN     = "vxlan"
)

// The audit log keeps 100 MB per file, 10 files, for 30 days.
const (
	auditMaxSizeMB  = 100
	auditMaxBackups = 10
	auditMaxAgeDays = 30
)

// auditPolicy records metadata of every request, never a request or response body.
const auditPolicy = `# Written by kip: metadata of every request, never request or response bodies.
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
`

// AuditPolicy is the audit policy kip installs at AuditPolicyPath.
func AuditPolicy() []byte { return []byte(auditPolicy) }

// ServerConfig is what kip writes to a server's /etc/rancher/k3s/config.yaml.
type ServerConfig struct {
	NodeName       string
	NodeIP         string
	NodeExternalIP string
	TLSSANs        []string
	FlannelBackend string
	// Disable lists bundled k3s add-ons kip replaces with its own, e.g. traefik.
	Disable []string
	// AuthenticationConfigPath, when set, is the API server's structured authentication
	// configuration (operator login through Dex).
	AuthenticationConfigPath string
}

// KipServer is the configuration kip gives a server reached at address (its TLS name), with
// the pod network's flannel backend: nodeIP is its address on the nodes' network, externalIP
// its public address when the nodes use a private network ("" otherwise).
func KipServer(address, nodeIP, externalIP, network string) ServerConfig {
	return ServerConfig{
		NodeIP:                   nodeIP,
		NodeExternalIP:           externalIP,
		TLSSANs:                  []string{address},
		FlannelBackend:           network,
		Disable:                  []string{"traefik"},
		AuthenticationConfigPath: AuthenticationConfigPath,
	}
}

// APIServerArgs returns the kube-apiserver arguments kip installs, in a fixed order.
func (c ServerConfig) APIServerArgs() []string {
	args := []string{
		"audit-policy-file=" + AuditPolicyPath,
		"audit-log-path=" + AuditLogPath,
		"audit-log-maxsize=" + strconv.Itoa(auditMaxSizeMB),
		"audit-log-maxbackup=" + strconv.Itoa(auditMaxBackups),
		"audit-log-maxage=" + strconv.Itoa(auditMaxAgeDays),
	}
	if c.AuthenticationConfigPath != "" {
		args = append(args, "authentication-config="+c.AuthenticationConfigPath)
	}
	return args
}

// Render returns the config.yaml file.
func (c ServerConfig) Render() ([]byte, error) {
	switch c.FlannelBackend {
	case FlannelWireGuard, FlannelVXLAN:
	default:
		return nil, fmt.Errorf("flannel backend %q: use %s or %s", c.FlannelBackend, FlannelWireGuard, FlannelVXLAN)
	}
	if c.NodeIP == "" {
		return nil, fmt.Errorf("k3s config: no node IP")
	}
	doc := struct {
		NodeName            string   `json:"node-name,omitempty"`
		NodeIP              string   `json:"node-ip"`
		NodeExternalIP      string   `json:"node-external-ip,omitempty"`
		TLSSAN              []string `json:"tls-san,omitempty"`
		FlannelBackend      string   `json:"flannel-backend"`
		Disable             []string `json:"disable,omitempty"`
		WriteKubeconfigMode string   `json:"write-kubeconfig-mode"`
		APIServerArgs       []string `json:"kube-apiserver-arg"`
	}{c.NodeName, c.NodeIP, c.NodeExternalIP, c.TLSSANs, c.FlannelBackend, c.Disable, "0600", c.APIServerArgs()}
	body, err := yaml.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("render k3s config: %w", err)
	}
	return append([]byte("# Written by kip. kip keeps the previous file at "+ConfigBackupPath+" when it changes this one.\n"), body...), nil
}

// Paths of a worker's join: the server's join token, which kip copies to the worker's
// AgentTokenPath (0600) for k3s's token-file setting.
const (
	ServerTokenPath = "/var/lib/rancher/k3s/server/node-token"
	AgentTokenPath  = "/etc/rancher/k3s/agent-token"
)

// AgentConfig is what kip writes to a worker's /etc/rancher/k3s/config.yaml.
type AgentConfig struct {
	// Server is the server's address on the cluster's node network, ServerURL its API.
	Server         string
	NodeName       string
	NodeIP         string
	NodeExternalIP string
	// Taints are applied when the node registers: kip's joining taint keeps ordinary workloads
	// off a node until kip node add checked it.
	Taints []string
}

// ServerURL is the server's API as the agent reaches it.
func (c AgentConfig) ServerURL() string {
	return "https://" + net.JoinHostPort(c.Server, "6443")
}

// Render returns the config.yaml file.
func (c AgentConfig) Render() ([]byte, error) {
	if c.Server == "" || c.NodeIP == "" || c.NodeName == "" {
		return nil, fmt.Errorf("k3s agent config: the server's address, the node's name and its IP are all needed")
	}
	doc := struct {
		Server         string   `json:"server"`
		TokenFile      string   `json:"token-file"`
		NodeName       string   `json:"node-name"`
		NodeIP         string   `json:"node-ip"`
		NodeExternalIP string   `json:"node-external-ip,omitempty"`
		NodeTaint      []string `json:"node-taint,omitempty"`
	}{c.ServerURL(), AgentTokenPath, c.NodeName, c.NodeIP, c.NodeExternalIP, c.Taints}
	body, err := yaml.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("render k3s agent config: %w", err)
	}
	return append([]byte("# Written by kip node add.\n"), body...), nil
}
