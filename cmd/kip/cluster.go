package main

import (
	"context"
	"strings"

	"github.com/spf13/cobra"

	"kipper.run/kip/internal/buildinfo"
	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/platform"
	"kipper.run/kip/internal/prune"
	"kipper.run/kip/internal/sshx"
)

func newClusterCmd(f *cli.Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Change how the cluster as a whole keeps its data",
		Args:  usageArgs(cobra.NoArgs),
		RunE:  func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	copies := &platform.CopiesOptions{}
	storage := &cobra.Command{
		Use:   "storage [--max-copies 2]",
		Short: "Offer two copies of a service's data, switch the cluster's storage to Longhorn, prune the local copies moves kept",
		Long: `With --max-copies 2, an admin offers two copies of a service's data, once: kip creates the class of
two-copy Longhorn volumes (kipper-longhorn-2) and records the offer. A deployer then chooses one or
two copies when creating a service ('kip service add TYPE --name NAME --copies 2 ...'); two copies
need two Ready nodes that can hold copies ('kip node list'). Existing services keep their storage
as it is. The offer needs Longhorn storage, and kip does not take it back.`,
		Example: "  kip cluster storage --max-copies 2",
		Args:    usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("max-copies") {
				return cmd.Help()
			}
			copies.Options = platformOptions(f)
			return platform.OfferCopies(cmd.Context(), copies)
		},
	}
	storage.Flags().IntVar(&copies.MaxCopies, "max-copies", 1, "offer this many copies of a service's data (2) to services created from now on")
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
	storage.AddCommand(longhorn, newPruneCmd(f))
	cmd.AddCommand(storage)
	return cmd
}

func newPruneCmd(f *cli.Factory) *cobra.Command {
	o := &prune.Options{}
	cmd := &cobra.Command{
		Use:   "prune [NAME --project P [--environment E]]",
		Short: "Delete the local copies that moves to Longhorn kept, once nothing needs them",
		Long: `Delete the local copies that moves to Longhorn kept on the server. kip lists the copies, asks once,
and deletes a copy only when all of these hold, checking each again right before it deletes it:

  - its service still has its data on the Longhorn volume the move verified, and the move finished;
  - the service's pod uses that volume and has been Ready for at least an hour (the hour starts
    again when the pod becomes Ready after a crash);
  - a completed backup made after the move holds the service's data from Longhorn, or a day has
    passed since the move (a Postgres or MySQL service with consistent backups always waits the day);
  - no change of that volume's copy count is under way.

A copy whose service and data claim are both gone is deleted without these checks, and listed
apart. A copy is kept when its service lost or replaced that volume: it may hold the only original
data. Deleting a copy cannot be undone. Interrupted, the next prune finishes the copy it was
deleting. 'kip status' shows each kept copy and why it is kept. See docs/prune.md.`,
		Example: "  kip cluster storage prune\n" +
			"  kip cluster storage prune --now\n" +
			"  kip cluster storage prune db --project shop --delete-unproven",
		Args: usageArgs(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				o.Name = args[0]
			}
			if err := o.Validate(); err != nil {
				return cli.Usagef("%v", err)
			}
			if err := f.Prompter().CanConfirm(); err != nil {
				return err
			}
			server, dial, err := hostDialer(f)
			if err != nil {
				return err
			}
			o.Kube, o.Printer, o.Prompter = f.Kube, f.Printer(), f.Prompter()
			o.Holder, o.KipVersion = f.CommandLine(), buildinfo.Version
			o.Server = server
			o.Remove = func(ctx context.Context, host, dir string) error {
				_, err := onServer(ctx, dial, host, prune.RemoveCommand(dir), (*sshx.Client).Output)
				return err
			}
			o.Present = func(ctx context.Context, host, dir string) (bool, error) {
				out, err := onServer(ctx, dial, host, prune.PresentCommand(dir), (*sshx.Client).Query)
				return strings.TrimSpace(string(out)) == "present", err
			}
			return prune.Run(cmd.Context(), o)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.Project, "project", "", "the named service's project")
	fl.StringVar(&o.Environment, "environment", "", "the named service's environment, when the project has it in several")
	fl.BoolVar(&o.Now, "now", false, "do not wait for a backup made after the move or a day: the health check still applies")
	fl.BoolVar(&o.Unproven, "delete-unproven", false, "for the named service only: waive the check that its pod has been Ready on Longhorn for an hour")
	return cmd
}

// onServer runs cmd on host over SSH with run (Client.Output for a command that changes the host,
// Client.Query for one that only reads it). Every call shares the factory's one connection to
// the host, which kip closes as it exits.
func onServer(ctx context.Context, dial func(ctx context.Context, host string) (*sshx.Client, error), host, cmd string,
	run func(*sshx.Client, context.Context, string) ([]byte, error)) ([]byte, error) {
	c, err := dial(ctx, host)
	if err != nil {
		return nil, err
	}
	return run(c, ctx, cmd)
}
