package main

import (
	"github.com/spf13/cobra"

	"kipper.run/kip/internal/cli"
)

func newRootCmd(f *cli.Factory) *cobra.Command {
	g := &f.Global
	cmd := &cobra.Command{
		Use:   "kip",
		Short: "Run a Kipper cluster on your own Linux servers",
		Long: `kip turns your own Linux servers into a Kipper cluster (k3s, Longhorn or local storage,
Velero backups, the Kipper console) and keeps it healthy: growing a small server onto
Longhorn, adding and fencing worker nodes, and upgrading k3s and Longhorn safely.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return cli.Usagef("unknown command %q for kip", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			g.SSHUserSet = cmd.Flags().Changed("ssh-user")
			return g.Validate()
		},
	}
	cmd.CompletionOptions.DisableDefaultCmd = true
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &cli.UsageError{Err: err} })

	pf := cmd.PersistentFlags()
	pf.StringVar(&g.Cluster, "cluster", "", "cluster to act on, as saved in ~/.kip/config.yaml (env KIP_CLUSTER)")
	pf.StringVar(&g.Kubeconfig, "kubeconfig", "", "kubeconfig file to use instead of the cluster's saved one")
	pf.StringVar(&g.Context, "context", "", "kubeconfig context to use")
	pf.StringVar(&g.SSHKey, "ssh-key", "", "SSH private key; falls back to KIP_SSH_KEY, then the cluster's saved key, then ~/.ssh/config and your ssh-agent")
	pf.StringVar(&g.SSHUser, "ssh-user", "root", "SSH user; a user other than root runs commands with 'sudo -n'")
	pf.BoolVarP(&g.Yes, "yes", "y", false, "answer yes to confirmation prompts (required when not running interactively)")
	pf.StringVarP(&g.Output, "output", "o", cli.OutputText, "output format: text or json")
	pf.CountVarP(&g.Verbose, "verbose", "v", "print more detail (repeat for more)")

	cmd.AddCommand(
		newVersionCmd(f, nil),
		newInstallCmd(f, nil),
		newPlatformCmd(f),
		newCompletionCmd(f),
		newStatusCmd(f, nil),
		newDoctorCmd(f, nil),
		newBackupCmd(f, backupRunners{}),
		newServiceCmd(f),
		newAppCmd(f),
		newCredentialsCmd(f, credentialRunners{}),
		newProjectCmd(f),
		newClusterCmd(f),
		newNodeCmd(f, nodeRunners{}),
		newUpgradeCmd(f, nil),
	)
	return cmd
}
