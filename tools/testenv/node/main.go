// Command testenv-node is the node components lab hosts run under the k3s stand-in, in one
// binary: started as kubelet, kube-proxy, containerd or ctr (links of those names), it runs that
// command. One link instead of four. It is never linked into kip. (containerd's runc
// shim is a binary of its own: it starts itself again by its own path. So is CoreDNS, which goes
// into a container image.) containerd and ctr are in containerd.go, which the older release's
// build (tools/testenv.sh older, -tags testenv_older) leaves out: that build is the kubelet and
// kube-proxy only, and the lab's nodes keep the current build's containerd.
package main

import (
	"context"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubeproxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"

	"kipper.run/kip/tools/testenv/multicall"
)

// commands are the binary's commands by name; containerd.go adds containerd's.
var commands = map[string]func() int{
	"kubelet":    func() int { return cli.Run(kubelet.NewKubeletCommand(context.Background())) },
	"kube-proxy": func() int { return cli.Run(kubeproxy.NewProxyCommand()) },
}

func main() { multicall.Main("testenv-node", commands) }
