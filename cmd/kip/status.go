package main

import (
	"context"

	"github.com/spf13/cobra"

	"kipper.run/kip/internal/buildinfo"
	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/config"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/status"
)

func newStatusCmd(f *cli.Factory, runF func(*status.Options) error) *cobra.Command {
	opts := &status.Options{}
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the cluster's nodes, storage, components and unfinished operations",
		Long: `Show the cluster: each node's role, status (OutOfService when fenced) and k3s version; the
storage mode, profile and monitoring kip recorded; each node's free disk and largest volumes,
with a warning when the disk runs low; the health of each component kip installed; and the kip
operations that did not finish, including moves to Longhorn.

Longhorn disks and volumes are read through the API. On local storage, the server's free disk
and the space each volume uses are read over SSH; without SSH (--api-only, or no key that logs
in) status reports what the API gives and says what it skipped. When the API does not answer,
status shows what SSH sees of k3s on the server instead. See docs/status.md.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := wireStatus(f, opts); err != nil {
				return err
			}
			if runF != nil {
				return runF(opts)
			}
			return status.Run(cmd.Context(), opts)
		},
	}
	cmd.Flags().BoolVar(&opts.APIOnly, "api-only", false, "read only the Kubernetes API: connect to no host over SSH")
	return cmd
}

// wireStatus gives status and doctor their output, API clients and SSH. The saved cluster's
// host and SSH settings are used unless --kubeconfig alone chose another cluster, whose server
// the cluster record names.
func wireStatus(f *cli.Factory, opts *status.Options) error {
	opts.JSON = f.Global.Output == cli.OutputJSON
	opts.Out = f.IO.Out
	opts.Kube = f.Kube
	opts.KipVersion = buildinfo.Version
	if opts.APIOnly {
		return nil
	}
	server, dial, err := hostDialer(f)
	opts.Server, opts.Dial = server, dial
	return err
}

// savedCluster is the saved cluster a command acts on, nil when --kubeconfig alone chose
// another cluster.
func savedCluster(f *cli.Factory) (*config.Cluster, error) {
	if f.Global.Kubeconfig != "" && f.ClusterName() == "" {
		return nil, nil
	}
	return f.Cluster()
}

// hostDialer is how a command reaches the cluster's hosts over SSH: the saved cluster's server
// address ("" when --kubeconfig alone chose another cluster, whose server the cluster record
// names) and a dial with the saved cluster's SSH settings.
func hostDialer(f *cli.Factory) (string, func(ctx context.Context, host string) (*sshx.Client, error), error) {
	saved, err := savedCluster(f)
	if err != nil {
		return "", nil, err
	}
	server := ""
	if saved != nil {
		server = saved.Host
	}
	return server, func(ctx context.Context, host string) (*sshx.Client, error) {
		c, err := f.SSHConfig(host, saved)
		if err != nil {
			return nil, err
		}
		return f.SSH(ctx, c)
	}, nil
}
