package main

import (
	"context"

	"github.com/spf13/cobra"

	"kipper.run/kip/internal/backup"
	"kipper.run/kip/internal/cli"
)

// backupRunners lets tests replace each kip backup workflow; nil fields run the real one.
type backupRunners struct {
	create   func(*backup.CreateOptions) error
	list     func(*backup.ListOptions) error
	describe func(*backup.DescribeOptions) error
	restore  func(*backup.RestoreOptions) error
	drill    func(*backup.DrillOptions) error
	repoKey  func(*backup.ExportOptions) error
	sseKey   func(*backup.ExportOptions) error
}

func newBackupCmd(f *cli.Factory, r backupRunners) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "backup",
		Short: "Create, list, describe, restore and drill Velero backups; export the keys a recovery needs",
		Long: `Back up Kipper's namespaces with Velero, to the cluster's backup storage: objects and, through
Velero's node agent, the files of every volume a running pod mounts.

A backup is a completed backup, the kind kip's other commands rely on (a service move, prune,
kip node reboot, Longhorn upgrades), only when Velero finished it with no errors, it has not
expired, nobody is deleting it, and it holds a file-system backup of every volume its pods
mounted: Velero skips the volumes of a pod that is not Running and still calls the backup
Completed. kip backup list and describe say, for each backup, whether it is one and why not.

A cluster on local storage installed without --backup-storage-bucket has no backups. See
docs/backups.md.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newBackupCreateCmd(f, r.create), newBackupListCmd(f, r.list), newBackupDescribeCmd(f, r.describe),
		newBackupRestoreCmd(f, r.restore), newBackupDrillCmd(f, r.drill),
		newBackupKeyCmd(f, "repository-key", "Export Velero's backup repository key, without which no volume backup can be read", r.repoKey, backup.ExportRepositoryKey),
		newBackupKeyCmd(f, "sse-key", "Export the SSE-C key the backup bucket's objects are encrypted with", r.sseKey, backup.ExportSSEKey))
	return cmd
}

// backupOptions fills what every kip backup command needs from the factory.
func backupOptions(f *cli.Factory) backup.Options {
	return backup.Options{Kube: f.Kube, Printer: f.Printer(), JSON: f.Global.Output == cli.OutputJSON, Out: f.IO.Out}
}

func newBackupCreateCmd(f *cli.Factory, runF func(*backup.CreateOptions) error) *cobra.Command {
	o := &backup.CreateOptions{}
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Back up a project's namespaces, named namespaces, or every Kipper project's",
		Long: `Start a Velero backup of a project's namespaces (--project), of the namespaces named
(--namespace, repeatable), or by default of every Kipper project's namespaces. With --wait, wait
until it finishes and check that it is a completed backup.

Velero backs up the files of every volume a running pod mounts. A claim whose pods are not
Running when the backup runs, or that no pod mounts (a stopped service's), gets no file backup:
kip warns before it starts, and the backup is not a completed backup. Pods, claims and volumes labelled velero.io/exclude-from-backup=true (the copy pods of
storage moves) are left out.`,
		Example: "  kip backup create --project shop --wait\n  kip backup create --namespace shop-prod --ttl 168h",
		Args:    usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.Project != "" && len(o.Namespaces) > 0 {
				return cli.Usagef("--project and --namespace cannot be combined: a project's backup holds all of its namespaces")
			}
			o.Options, o.Holder = backupOptions(f), f.CommandLine()
			if runF != nil {
				return runF(o)
			}
			_, err := backup.Create(cmd.Context(), o)
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.Project, "project", "", "back up this project's namespaces")
	fl.StringSliceVar(&o.Namespaces, "namespace", nil, "back up this namespace (repeatable, or comma-separated)")
	fl.BoolVar(&o.Wait, "wait", false, "wait until the backup finishes, showing its progress")
	fl.DurationVar(&o.TTL, "ttl", backup.DefaultTTL, "how long Velero keeps the backup")
	return cmd
}

func newBackupListCmd(f *cli.Factory, runF func(*backup.ListOptions) error) *cobra.Command {
	o := &backup.ListOptions{}
	cmd := &cobra.Command{
		Use:     "list",
		Short:   "List backups, newest first, with whether each is a completed backup",
		Example: "  kip backup list\n  kip backup list --project shop -o json",
		Args:    usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Options = backupOptions(f)
			if runF != nil {
				return runF(o)
			}
			return backup.List(cmd.Context(), o)
		},
	}
	cmd.Flags().StringVar(&o.Project, "project", "", "only backups that hold this project's namespaces")
	return cmd
}

func newBackupDescribeCmd(f *cli.Factory, runF func(*backup.DescribeOptions) error) *cobra.Command {
	o := &backup.DescribeOptions{}
	return &cobra.Command{
		Use:     "describe NAME",
		Short:   "Show a backup: phase, times, expiry, errors, warnings, and its volume backups per namespace",
		Example: "  kip backup describe shop-20261202-031500",
		Args:    usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Options, o.Name = backupOptions(f), args[0]
			if runF != nil {
				return runF(o)
			}
			return backup.Describe(cmd.Context(), o)
		},
	}
}

func newBackupRestoreCmd(f *cli.Factory, runF func(*backup.RestoreOptions) error) *cobra.Command {
	o := &backup.RestoreOptions{}
	var mapping string
	cmd := &cobra.Command{
		Use:   "restore NAME",
		Short: "Restore a backup's namespaces, in place or beside the originals",
		Long: `Restore a backup's namespaces (all of them, or those named with --namespace) and wait until
Velero finishes. A restore never replaces an object that exists: into a namespace that still holds
a service's objects (Kipper services and apps, StatefulSets, Deployments, claims, Services,
Secrets, ConfigMaps) it brings back only what is missing there, such as a service deleted with
kip service delete --delete-data to restore it from an older backup, and kip lists what it skips
and asks first (--yes answers). To restore everything, delete those objects first, or restore
beside them under another name with --namespace-mapping.`,
		Example: "  kip backup restore shop-20261202-031500 --namespace shop-prod\n" +
			"  kip backup restore shop-20261202-031500 --namespace-mapping shop-prod:shop-prod-restored",
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := backup.ParseMapping(mapping)
			if err != nil {
				return err
			}
			o.Options, o.Name, o.Mapping, o.Prompter = backupOptions(f), args[0], m, f.Prompter()
			if runF != nil {
				return runF(o)
			}
			return backup.Restore(cmd.Context(), o)
		},
	}
	cmd.Flags().StringSliceVar(&o.Namespaces, "namespace", nil, "restore only this namespace of the backup (repeatable)")
	cmd.Flags().StringVar(&mapping, "namespace-mapping", "", "restore namespaces under other names: source:target,…")
	return cmd
}

func newBackupDrillCmd(f *cli.Factory, runF func(*backup.DrillOptions) error) *cobra.Command {
	o := &backup.DrillOptions{}
	return &cobra.Command{
		Use:   "drill NAMESPACE",
		Short: "Prove a namespace's latest completed backup restores: restore it beside the original, wait for Ready, remove it",
		Long: `Restore the namespace's latest completed backup beside it as <namespace>-drill, wait up to 15
minutes for its Deployments, StatefulSets and DaemonSets to be Ready, report, and remove the copy,
also when they do not become Ready. The copy runs a second set of the namespace's services, so
the server needs room for them; on the nano profile drill is refused: restore a Postgres
service's dump with kip service restore-dump instead.`,
		Example: "  kip backup drill shop-prod",
		Args:    usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Options, o.Namespace = backupOptions(f), args[0]
			if runF != nil {
				return runF(o)
			}
			return backup.Drill(cmd.Context(), o)
		},
	}
}

// newBackupKeyCmd is kip backup repository-key|sse-key, whose one subcommand is export --to FILE.
func newBackupKeyCmd(f *cli.Factory, name, short string, runF func(*backup.ExportOptions) error, run func(context.Context, *backup.ExportOptions) error) *cobra.Command {
	cmd := &cobra.Command{
		Use:   name,
		Short: short,
		Args:  usageArgs(cobra.NoArgs),
		RunE:  func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	o := &backup.ExportOptions{}
	export := &cobra.Command{
		Use:     "export --to FILE",
		Short:   short + " to a new file, mode 0600",
		Example: "  kip backup " + name + " export --to ./" + name,
		Args:    usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.To == "" {
				return cli.Usagef("--to FILE is required: the new file kip writes the key to")
			}
			o.Options = backupOptions(f)
			if runF != nil {
				return runF(o)
			}
			return run(cmd.Context(), o)
		},
	}
	export.Flags().StringVar(&o.To, "to", "", "file to write the key to; it must not exist")
	cmd.AddCommand(export)
	return cmd
}
