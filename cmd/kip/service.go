package main

import (
	"context"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"kipper.run/kip/internal/backup"
	"kipper.run/kip/internal/buildinfo"
	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/move"
	"kipper.run/kip/internal/mover/moverpod"
	"kipper.run/kip/internal/service"
)

func newServiceCmd(f *cli.Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "service",
		Short: "Start, stop, inspect, update and delete a project's services (databases, caches, object stores)",
		Long: `Act on a Kipper service: a stateful service of a project's environment (Postgres, MySQL,
Redis, MinIO…) with its own volume. kip writes the service's Kipper object and console-api runs
its workload (docs/console.md). Every command names the service with --project and --environment.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.AddCommand(
		newServiceActionCmd(f, "start", "Start a stopped service and wait until its pod is Ready",
			"A service whose move to Longhorn is not finished stays stopped: finish the move or roll it back.\n"+
				"A service kip node fence stopped starts only after the fence's check: another node holds a\n"+
				"current copy of every one of its volumes (or the fenced worker is back), or you accept copies\n"+
				"that may be older (a yes on a terminal, or --accept-stale-data); one whose only copy is on the\n"+
				"fenced worker waits for it to rejoin.", false, service.Start,
			func(fl *pflag.FlagSet, o *service.ServiceOptions) {
				fl.BoolVar(&o.AcceptStale, "accept-stale-data", false, "start a service the fence stopped on copies of its data that may be older")
			}),
		newServiceActionCmd(f, "stop", "Stop a service and wait until its pods are gone", "", false, service.Stop),
		newServiceActionCmd(f, "info", "Show where a service runs and where its data is", "", false, service.ShowInfo),
		newServiceDeleteCmd(f),
		newServiceActionCmd(f, "recreate-dump", "Replace a database service's dump volume with an empty one",
			"The service stops while its dump volume is replaced and starts again if it was running; the next\nscheduled dump fills the new volume. Refused while a move of the service's data is not finished.", true, service.RecreateDump),
		newServiceRestoreDumpCmd(f),
		newServiceAddCmd(f),
		newServiceUpdateCmd(f),
		newServiceStorageCmd(f),
	)
	return cmd
}

func newServiceStorageCmd(f *cli.Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "storage",
		Short: "Move a service's data to another kind of storage",
		Args:  usageArgs(cobra.NoArgs),
		RunE:  func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	o := &move.Options{}
	longhorn := &cobra.Command{
		Use:   "longhorn NAME [--project P --environment E]",
		Short: "Move a service's data from its local volume onto a new Longhorn volume, verified",
		Long: `Move a service's data from its local volume onto a new single-copy Longhorn volume. kip counts the
data and estimates the downtime, asks once, then stops the service, keeps every other pod off its
volumes, copies the data, detaches the new volume, verifies the copy on a fresh mount against the
original, commits, and starts the service on Longhorn. The local volume stays on the server as a
fallback until 'kip cluster storage prune' deletes it. The move's pods run the data mover's image,
which kip carries and imports over SSH into the node's containerd when it is not there.

Interrupted, the same command continues from its step. Until the move commits, --rollback undoes
it and starts the service on its local volume again, also when the move's record was lost.

On a cluster with backups a completed backup of the service's project is required ('kip backup
create --project P --wait'); on one without, pass --no-backup. See docs/moves.md.`,
		Example: "  kip service storage longhorn db --project shop --environment staging\n" +
			"  kip service storage longhorn db --project shop --environment staging --rollback",
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			server, dial, err := hostDialer(f)
			if err != nil {
				return err
			}
			o.Kube, o.Printer, o.Prompter, o.Out = f.Kube, f.Printer(), f.Prompter(), f.IO.Out
			o.Holder, o.KipVersion, o.Name = f.CommandLine(), buildinfo.Version, args[0]
			o.Server = server
			o.Deliver = func(ctx context.Context, host string) (bool, error) {
				c, err := dial(ctx, host) // the factory's connection, closed as kip exits
				if err != nil {
					return false, err
				}
				return moverpod.Deliver(ctx, c)
			}
			return move.Run(cmd.Context(), o)
		},
	}
	// The spec names the service alone: --project and --environment pick it when several
	// environments have a service of that name (service.Find).
	longhorn.Flags().StringVar(&o.Project, "project", "", "the service's project, when several have a service of that name")
	longhorn.Flags().StringVar(&o.Environment, "environment", "", "the project's environment, when several have a service of that name")
	longhorn.Flags().BoolVar(&o.NoBackup, "no-backup", false, "move on a cluster without backups")
	longhorn.Flags().BoolVar(&o.Rollback, "rollback", false, "undo an unfinished move: the service starts on its local volume again")
	cmd.AddCommand(longhorn)
	return cmd
}

// newServiceRestoreDumpCmd is kip service restore-dump, the nano profile's check of a Postgres
// service's backup.
func newServiceRestoreDumpCmd(f *cli.Factory) *cobra.Command {
	o := &backup.RestoreDumpOptions{}
	cmd := &cobra.Command{
		Use:   "restore-dump NAME [--project P --environment E] [--backup BACKUP]",
		Short: "Check a Postgres service's backup: restore its database dump into a scratch database and report what it holds",
		Long: `Check a Postgres service's backup without a second copy of the service: kip restores the
service's dump volume from the newest completed backup that holds it (or the one --backup names)
into a scratch namespace, <namespace>-<service>-dump, starts a scratch Postgres from the service's
own image beside it, loads the newest pg_dump archive on the volume into it, and reports each
table and its rows. The scratch namespace is removed at the end, also when the load fails. The
service, its volumes and its namespace are not touched.

The scratch database uses up to 512 MiB of memory and, on the node's disk, up to eight times the
archive's size (at least 1 GiB). Interrupted, the same command removes what the earlier run left
and starts again. kip backup drill checks a whole namespace, except on the nano profile.`,
		Example: "  kip service restore-dump db\n" +
			"  kip service restore-dump db --project shop --environment prod --backup shop-20261206-020000",
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Options, o.Ref.Name = backupOptions(f), args[0]
			return backup.RestoreDump(cmd.Context(), o)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.Ref.Project, "project", "", "the service's project, when several have a service of that name")
	fl.StringVar(&o.Ref.Environment, "environment", "", "the project's environment, when several have a service of that name")
	fl.StringVar(&o.Backup, "backup", "", "the backup to restore from (default: the newest completed one that holds the dump)")
	return cmd
}

// serviceFlags binds the flags that name a service.
func serviceFlags(cmd *cobra.Command, ref *service.Ref) {
	fl := cmd.Flags()
	fl.StringVar(&ref.Project, "project", "", "the service's project (required)")
	fl.StringVar(&ref.Environment, "environment", "", "the project's environment, e.g. staging (required)")
	_ = cmd.MarkFlagRequired("project")
	_ = cmd.MarkFlagRequired("environment")
}

func serviceOptions(f *cli.Factory) service.Options {
	return service.Options{Kube: f.Kube, Printer: f.Printer(), Prompter: f.Prompter(),
		JSON: f.Global.Output == cli.OutputJSON, Out: f.IO.Out}
}

// newServiceActionCmd is a kip service command on one service; flags binds any options of its own.
func newServiceActionCmd(f *cli.Factory, use, short, long string, confirms bool, run func(context.Context, *service.ServiceOptions) error,
	flags ...func(*pflag.FlagSet, *service.ServiceOptions)) *cobra.Command {
	o := &service.ServiceOptions{}
	cmd := &cobra.Command{
		Use:     use + " NAME --project P --environment E",
		Short:   short,
		Long:    short + ".\n\n" + long,
		Example: "  kip service " + use + " db --project shop --environment staging",
		Args:    usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if confirms {
				if err := f.Prompter().CanConfirm(); err != nil {
					return err
				}
			}
			o.Options, o.Name = serviceOptions(f), args[0]
			return run(cmd.Context(), o)
		},
	}
	serviceFlags(cmd, &o.Ref)
	for _, bind := range flags {
		bind(cmd.Flags(), o)
	}
	return cmd
}

// newServiceDeleteCmd is kip service delete, which deletes the service's data with it only when
// --delete-data says so.
func newServiceDeleteCmd(f *cli.Factory) *cobra.Command {
	deleteData := false
	cmd := newServiceActionCmd(f, "delete", "Delete a service and its volumes with their data",
		"The data goes with the service's volumes, so kip asks for --delete-data. Refused while a move of\nthe service's data to Longhorn is not finished.", true,
		func(ctx context.Context, o *service.ServiceOptions) error {
			if !deleteData {
				return cli.Usagef("kip service delete deletes the service's volumes with their data: pass --delete-data (take a backup first with 'kip backup create --project %s --wait')", o.Project)
			}
			return service.Delete(ctx, o)
		})
	cmd.Example = "  kip service delete db --project shop --environment staging --delete-data"
	cmd.Flags().BoolVar(&deleteData, "delete-data", false, "delete the service's volumes with their data (required)")
	return cmd
}

func newServiceAddCmd(f *cli.Factory) *cobra.Command {
	o := &service.AddOptions{}
	cmd := &cobra.Command{
		Use:   "add TYPE --name NAME --project P --environment E [--copies 1|2] [--storage SIZE]",
		Short: "Create a service and wait until it runs",
		Long: `Create a Kipper service of TYPE (` + strings.Join(service.Types, ", ") + `) in a project's environment, and wait
until console-api runs it. --copies 2 keeps two copies of its data, each on a different node, so
the data survives the loss of either node's disk: it needs an admin's offer ('kip cluster storage
--max-copies 2') and two Ready nodes that can hold copies ('kip node list'). The number of copies
is chosen once, when the service is created. A database's dump volume keeps one copy.`,
		Example: "  kip service add postgres --name db --project shop --environment prod\n" +
			"  kip service add postgres --name db --project shop --environment prod --copies 2",
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Options, o.Type = serviceOptions(f), args[0]
			return service.Add(cmd.Context(), o)
		},
	}
	serviceFlags(cmd, &o.Ref)
	fl := cmd.Flags()
	fl.StringVar(&o.Name, "name", "", "the service's name (required)")
	_ = cmd.MarkFlagRequired("name")
	fl.IntVar(&o.Copies, "copies", 1, "copies of its data, each on a different node: 1 or 2")
	fl.StringVar(&o.Storage, "storage", "", "declared size of the data volume, e.g. 20Gi (console-api's default when unset)")
	return cmd
}

func newServiceUpdateCmd(f *cli.Factory) *cobra.Command {
	o := &service.UpdateOptions{}
	cmd := &cobra.Command{
		Use:   "update NAME --project P --environment E [--cpu Q] [--memory Q] [--storage SIZE] [--copies N]",
		Short: "Change a service's CPU or memory request or its declared volume size, or record its copies",
		Long: `Change a service's CPU request (--cpu, e.g. 405m), memory request (--memory, e.g. 512Mi) or the
declared size of its data volume (--storage, e.g. 20Gi; a size only grows). console-api restarts
the service's pod with the new values.

--copies N records the copies of a service created before copies were recorded: N must be the
number Longhorn keeps of its data volume (one for a local volume), as 'kip service info' shows.
Changing the number of copies of an existing service is not available yet.`,
		Example: "  kip service update db --cpu 405m --project shop --environment staging\n" +
			"  kip service update db --storage 20Gi --project shop --environment prod",
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("copies") && o.Copies == 0 {
				return cli.Usagef("--copies 0: a service keeps one or two copies of its data")
			}
			o.Options, o.Name = serviceOptions(f), args[0]
			return service.Update(cmd.Context(), o)
		},
	}
	serviceFlags(cmd, &o.Ref)
	fl := cmd.Flags()
	fl.StringVar(&o.CPU, "cpu", "", "CPU request, e.g. 405m")
	fl.StringVar(&o.Memory, "memory", "", "memory request, e.g. 512Mi")
	fl.StringVar(&o.Storage, "storage", "", "declared size of the data volume, e.g. 20Gi")
	fl.IntVar(&o.Copies, "copies", 0, "record the copies of a service whose copies are unset (the number Longhorn keeps)")
	return cmd
}

func newProjectCmd(f *cli.Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "project",
		Short: "Delete a project, or remove one of its environments",
		Args:  usageArgs(cobra.NoArgs),
		RunE:  func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	del := &service.ProjectOptions{}
	deleteCmd := &cobra.Command{
		Use:   "delete PROJECT",
		Short: "Delete a project with its namespaces and everything in them",
		Long: `Delete a Kipper project: console-api deletes its namespaces, one per environment, with every
app, service and volume in them. Refused while a move of a service's data to Longhorn is not
finished in the project.`,
		Example: "  kip project delete shop",
		Args:    usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.Prompter().CanConfirm(); err != nil {
				return err
			}
			del.Options, del.Project = serviceOptions(f), args[0]
			return service.DeleteProject(cmd.Context(), del)
		},
	}
	rm := &service.ProjectOptions{}
	removeEnvCmd := &cobra.Command{
		Use:   "remove-env PROJECT ENVIRONMENT",
		Short: "Remove an environment from a project and delete its namespace",
		Long: `Remove an environment from a Kipper project: console-api deletes its namespace with every app,
service and volume in it. Refused while a move of a service's data to Longhorn is not finished
in that environment.`,
		Example: "  kip project remove-env shop staging",
		Args:    usageArgs(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.Prompter().CanConfirm(); err != nil {
				return err
			}
			rm.Options, rm.Project, rm.Environment = serviceOptions(f), args[0], args[1]
			return service.RemoveEnv(cmd.Context(), rm)
		},
	}
	cmd.AddCommand(deleteCmd, removeEnvCmd)
	return cmd
}
