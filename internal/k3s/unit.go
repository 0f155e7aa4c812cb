package k3s

import (
	_ "embed"
	"fmt"

	"kipper.run/kip/internal/sshx"
)

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

// shims matches the command lines of the shims of k3s's containerd, which name its socket. The
// bracket keeps it from matching the shell that runs pgrep with it.
const shims = "[c]ontainerd-shim.* -address /run/k3s/containerd/containerd.sock"

// stopScript defines the shell functions wipe.sh and fence.sh share; each script runs after it.
//
//go:embed stop.sh
var stopScript string

//go:embed wipe.sh
var wipeScript string

// WipeAgentCommand removes k3s-agent from a worker: the service and every container it ran,
// their mounts, the network interfaces and iptables rules k3s and flannel made, and k3s's
// files. keepLonghorn leaves Longhorn's data directory as it is; otherwise it is emptied (the
// directory stays, as it may be a mount). Run again, it finds nothing to do.
func WipeAgentCommand(keepLonghorn bool) string {
	longhorn := "wipe-longhorn"
	if keepLonghorn {
		longhorn = "keep-longhorn"
	}
	return sshx.Command("sh", "-c", stopScript+wipeScript, "kip-wipe", BinaryPath, UnitPath(AgentUnit), longhorn, shims)
}

// AgentGoneCommand exits 0 when nothing of k3s-agent is left on the host: the service not
// running, no container shim, no k3s data, binary or unit.
func AgentGoneCommand() string {
	return "! systemctl is-active --quiet " + AgentUnit + " && ! pgrep -f " + sshx.Quote(shims) +
		" >/dev/null && " + sshx.Command("test", "!", "-e", "/var/lib/rancher/k3s", "-a", "!", "-e", BinaryPath, "-a", "!", "-e", UnitPath(AgentUnit))
}

// FenceDropIn is the systemd drop-in kip node fence installs on a worker so that k3s-agent does
// not start, also after a reboot, until kip node add removes it.
const FenceDropIn = "/etc/systemd/system/" + AgentUnit + ".service.d/kip-fence.conf"

//go:embed fence.sh
var fenceScript string

// FenceAgentCommand fences a worker that answers: the drop-in installed, k3s-agent and every
// container it ran stopped, their mounts unmounted. It prints what is left running or mounted
// (a container, a Longhorn process, a Longhorn or kubelet volume mount) and exits 1 when
// something is. Run again, it finds nothing to do.
func FenceAgentCommand() string {
	return sshx.Command("sh", "-c", stopScript+fenceScript, "kip-fence", "stop", FenceDropIn, shims)
}

// FencedCommand exits 0 when the fence holds the worker stopped: the drop-in in place and nothing
// left running or mounted; otherwise it prints what is left and exits 1.
func FencedCommand() string {
	return sshx.Command("sh", "-c", stopScript+fenceScript, "kip-fence", "check", FenceDropIn, shims)
}

// UnfenceAgentCommand removes the fence's drop-in, so that k3s-agent can start again.
func UnfenceAgentCommand() string {
	return sshx.Command("rm", "-f", FenceDropIn) + " && systemctl daemon-reload"
}
