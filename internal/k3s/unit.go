package k3s

import "fmt"

// Unit names: k3s on the server, k3s-agent on workers, as k3s's installer names them.
const (
	ServerUnit = "k3s"
	AgentUnit  = "k3s-agent"
)

// unitTemplate is the unit k3s's own installer writes, so that an operator's k3s knowledge and
// tools (systemctl, journalctl -u k3s, drop-ins) apply unchanged. %[1]s is the unit name and
// %[2]s the k3s subcommand.
const unitTemplate = `# Written by kip.
[Unit]
Description=Lightweight Kubernetes
Documentation=https://k3s.io
Wants=network-online.target
After=network-online.target

[Install]
WantedBy=multi-user.target

[Service]
Type=notify
EnvironmentFile=-/etc/default/%%N
EnvironmentFile=-/etc/sysconfig/%%N
EnvironmentFile=-/etc/systemd/system/%[1]s.service.env
KillMode=process
Delegate=yes
User=root
LimitNOFILE=1048576
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
TimeoutStartSec=0
Restart=always
RestartSec=5s
ExecStartPre=-/sbin/modprobe br_netfilter
ExecStartPre=-/sbin/modprobe overlay
ExecStart=` + BinaryPath + ` %[2]s
`

// Unit returns the systemd unit's name and file for a server ("server") or worker ("agent").
func Unit(role string) (name string, file []byte, err error) {
	switch role {
	case "server":
		name = ServerUnit
	case "agent":
		name = AgentUnit
	default:
		return "", nil, fmt.Errorf("k3s role %q: use server or agent", role)
	}
	return name, fmt.Appendf(nil, unitTemplate, name, role), nil
}

// UnitPath is where a unit's file goes.
func UnitPath(name string) string { return "/etc/systemd/system/" + name + ".service" }
