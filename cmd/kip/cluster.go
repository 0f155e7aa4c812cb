package main

import (
	"github.com/spf13/cobra"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/platform"
)

func newClusterCmd(f *cli.Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Change how the cluster as a whole keeps its data",
		Args:  usageArgs(cobra.NoArgs),
		RunE:  func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	storage := &cobra.Command{
		Use:   "storage",
		Short: "Switch the cluster's storage to Longhorn",
		Args:  usageArgs(cobra.NoArgs),
		RunE:  func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	o := &platform.LonghornOptions{}
	longhorn := &cobra.Command{
		Use:   "longhorn",
		Short: "Switch a cluster on local storage to Longhorn, in place",
		Long: `Switch a cluster on local storage to Longhorn, in place. Nothing stops: kip prepares the server
(Longhorn's kernel modules, iSCSI and NFS packages), installs Longhorn with kip's pinned settings,
and records Longhorn as the cluster's storage mode. Afterwards new volumes get one Longhorn copy,
kip node add accepts workers and shared (ReadWriteMany) volumes work. The platform's own volumes
(the registry, Loki) stay on local storage. It ends with each service volume still on local
storage and the command that moves it (kip service storage longhorn).

It refuses, naming the fix: a server with less than 6000 MiB of RAM; a node without 12% of its
allocatable CPU free for Longhorn's engine (suggesting service CPU reductions that make room); a
platform that an older kip installed; a disk that would not keep more than 25% free with a second
copy of every service volume; Rocky Linux and AlmaLinux 9.7 or later 9.x. Interrupted, run it
again and it continues.`,
		Example: "  kip cluster storage longhorn",
		Args:    usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			server, dial, err := hostDialer(f)
			if err != nil {
				return err
			}
			o.Options, o.Server, o.Dial = platformOptions(f), server, dial
			return platform.SwitchToLonghorn(cmd.Context(), o)
		},
	}
	storage.AddCommand(longhorn)
	cmd.AddCommand(storage)
	return cmd
}
