package main

import (
	"github.com/spf13/cobra"

	"kipper.run/kip/internal/buildinfo"
	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/platform"
)

func newPlatformVersionsCmd(f *cli.Factory, runF func(*platform.VersionsOptions) error) *cobra.Command {
	opts := &platform.VersionsOptions{}
	return &cobra.Command{
		Use:   "versions",
		Short: "Show the versions the cluster runs: kip, console-api, Kubernetes, charts and images",
		Long: `Show what the cluster runs, to check component versions after an upgrade:

  the kip version recorded on the App CRD (the kip that last wrote the Kipper schemas) and this
  kip's; the console-api build that console-api recorded when it started; each node's Kubernetes
  version; each chart's version pinned by this kip, asked for by its HelmChart and installed, from
  the Helm release state k3s's helm-controller leaves, with the release's status (a failed
  release is shown with the commands that recover it); and the pod template images of every
  Deployment, StatefulSet and DaemonSet in Kipper's system namespaces.

It reads the cluster through the API only. See docs/platform.md.`,
		Example: "  kip platform versions\n  kip platform versions -o json",
		Args:    usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.JSON = f.Global.Output == cli.OutputJSON
			opts.Out = f.IO.Out
			opts.Kube = f.Kube
			opts.KipVersion = buildinfo.Version
			if runF != nil {
				return runF(opts)
			}
			return platform.Versions(cmd.Context(), opts)
		},
	}
}
