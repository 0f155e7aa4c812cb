// Command testenv-node is the node components lab hosts run under the k3s stand-in, in one
// binary: started as kubelet, kube-proxy, containerd or ctr (links of those names), it runs that
// command. One link instead of four. It is never linked into kip. (containerd's runc
// shim is a binary of its own: it starts itself again by its own path. So is CoreDNS, which goes
// into a container image.)
package main

import (
	"context"
	"fmt"
	"os"

	_ "github.com/containerd/containerd/v2/cmd/containerd/builtins"
	"github.com/containerd/containerd/v2/cmd/containerd/command"
	ctr "github.com/containerd/containerd/v2/cmd/ctr/app"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubeproxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"

	"kipper.run/kip/tools/testenv/multicall"
)

func main() {
	multicall.Main("testenv-node", map[string]func() int{
		"kubelet":    func() int { return cli.Run(kubelet.NewKubeletCommand(context.Background())) },
		"kube-proxy": func() int { return cli.Run(kubeproxy.NewProxyCommand()) },
		"containerd": func() int { return urfave("containerd", command.App().Run) },
		"ctr":        func() int { return urfave("ctr", ctr.New().Run) },
	})
}

// urfave runs a command of containerd's (urfave/cli) as its main does.
func urfave(name string, run func(context.Context, []string) error) int {
	if err := run(context.Background(), os.Args); err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		return 1
	}
	return 0
}
