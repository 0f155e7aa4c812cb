package main

import (
	"context"

	"github.com/spf13/cobra"

	"kipper.run/kip/internal/cli"
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
			"A service whose move to Longhorn is not finished stays stopped: finish the move or roll it back.", false, service.Start),
		newServiceActionCmd(f, "stop", "Stop a service and wait until its pods are gone", "", false, service.Stop),
		newServiceActionCmd(f, "info", "Show where a service runs and where its data is", "", false, service.ShowInfo),
		newServiceActionCmd(f, "delete", "Delete a service and its volumes with their data",
			"Refused while a move of the service's data to Longhorn is not finished.", true, service.Delete),
		newServiceActionCmd(f, "recreate-dump", "Replace a database service's dump volume with an empty one",
			"The service stops while its dump volume is replaced and starts again if it was running; the next\nscheduled dump fills the new volume. Refused while a move of the service's data is not finished.", true, service.RecreateDump),
		newServiceUpdateCmd(f),
	)
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

func newServiceActionCmd(f *cli.Factory, use, short, long string, confirms bool, run func(context.Context, *service.ServiceOptions) error) *cobra.Command {
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
	return cmd
}

func newServiceUpdateCmd(f *cli.Factory) *cobra.Command {
	o := &service.UpdateOptions{}
	cmd := &cobra.Command{
		Use:   "update NAME --project P --environment E [--cpu Q] [--memory Q] [--storage SIZE]",
		Short: "Change a service's CPU or memory request or its declared volume size",
		Long: `Change a service's CPU request (--cpu, e.g. 405m), memory request (--memory, e.g. 512Mi) or the
declared size of its data volume (--storage, e.g. 20Gi; a size only grows). console-api restarts
the service's pod with the new values.`,
		Example: "  kip service update db --cpu 405m --project shop --environment staging\n" +
			"  kip service update db --storage 20Gi --project shop --environment prod",
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Options, o.Name = serviceOptions(f), args[0]
			return service.Update(cmd.Context(), o)
		},
	}
	serviceFlags(cmd, &o.Ref)
	fl := cmd.Flags()
	fl.StringVar(&o.CPU, "cpu", "", "CPU request, e.g. 405m")
	fl.StringVar(&o.Memory, "memory", "", "memory request, e.g. 512Mi")
	fl.StringVar(&o.Storage, "storage", "", "declared size of the data volume, e.g. 20Gi")
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
