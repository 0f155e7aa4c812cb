// Command testenv-control is the test environment's control plane in one binary: started as
// kube-apiserver, kube-controller-manager, kube-scheduler, kubectl or etcd (links of those names),
// it runs that command. One link instead of five. It is never linked into kip. (kwok is a binary
// of its own: linked here, its command would take a global "version" flag of another command's
// as its own, and its --version would fail.)
package main

import (
	"os"
	_ "time/tzdata" // CronJob time zones, as kube-apiserver and kube-controller-manager link it

	"go.etcd.io/etcd/server/v3/etcdmain"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"

	"kipper.run/kip/tools/testenv/multicall"
)

func main() {
	multicall.Main("testenv-control", map[string]func() int{
		"kube-apiserver":          func() int { return cli.Run(apiserver.NewAPIServerCommand()) },
		"kube-controller-manager": func() int { return cli.Run(controllermanager.NewControllerManagerCommand()) },
		"kube-scheduler":          func() int { return cli.Run(scheduler.NewSchedulerCommand()) },
		"kubectl":                 runKubectl,
		"etcd":                    func() int { etcdmain.Main(os.Args); return 0 },
	})
}

// runKubectl is kubectl's main.
func runKubectl() int {
	logs.GlogSetter(kubectl.GetLogVerbosity(os.Args)) //nolint:errcheck // as kubectl's main
	if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
		kubectlutil.CheckErr(err)
	}
	return 0
}
