package k3s

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite golden files")

func TestServerConfigRender(t *testing.T) {
	c := ServerConfig{
		NodeName: "server", NodeIP: "10.77.0.11", NodeExternalIP: "198.51.100.11",
		TLSSANs: []string{"203.0.113.10"}, FlannelBackend: FlannelWireGuard, Disable: []string{"traefik"},
		AuthenticationConfigPath: "/var/lib/rancher/k3s/server/kipper-authn.yaml",
	}
	got, err := c.Render()
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "config.yaml.golden")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("config.yaml:\n%s\nwant:\n%s", got, want)
	}
	for _, arg := range []string{"audit-log-path=/var/lib/rancher/k3s/server/logs/audit.log", "audit-log-maxsize=100", "audit-log-maxbackup=10", "audit-log-maxage=30"} {
		if !strings.Contains(string(got), arg) {
			t.Errorf("config lacks %s", arg)
		}
	}
}

func TestServerConfigRefusals(t *testing.T) {
	if _, err := (ServerConfig{NodeIP: "10.0.0.1", FlannelBackend: "host-gw"}).Render(); err == nil {
		t.Error("an unknown flannel backend was accepted")
	}
	if _, err := (ServerConfig{FlannelBackend: FlannelVXLAN}).Render(); err == nil {
		t.Error("a config without a node IP was accepted")
	}
}

func TestAuditPolicyIsMetadataOnly(t *testing.T) {
	var p struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		OmitStages []string `json:"omitStages"`
		Rules      []struct {
			Level string `json:"level"`
		} `json:"rules"`
	}
	if err := yaml.UnmarshalStrict(AuditPolicy(), &p); err != nil {
		t.Fatal(err)
	}
	if p.Kind != "Policy" || len(p.Rules) != 1 || p.Rules[0].Level != "Metadata" {
		t.Fatalf("policy %+v is not metadata-only", p)
	}
}

func TestAgentConfigRender(t *testing.T) {
	c := AgentConfig{Server: "10.77.0.20", NodeName: "w1", NodeIP: "10.77.0.21", NodeExternalIP: "198.51.100.21",
		Taints: []string{"kipper.run/joining=true:NoSchedule"}}
	got, err := c.Render()
	if err != nil {
		t.Fatal(err)
	}
	want := `# Written by kip node add.
node-external-ip: 198.51.100.21
node-ip: 10.77.0.21
node-name: w1
node-taint:
- kipper.run/joining=true:NoSchedule
server: https://10.77.0.20:6443
token-file: /etc/rancher/k3s/agent-token
`
	if string(got) != want {
		t.Errorf("agent config:\n%s\nwant:\n%s", got, want)
	}
	if _, err := (AgentConfig{Server: "10.77.0.20", NodeName: "w1"}).Render(); err == nil {
		t.Error("an agent config without a node IP rendered")
	}
}
