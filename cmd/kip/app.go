package main

import (
	"context"

	"github.com/spf13/cobra"

	"kipper.run/kip/internal/app"
	"kipper.run/kip/internal/cli"
)

func newAppCmd(f *cli.Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "app",
		Short: "Scale, stop, start, restart, autoscale and inspect a project's apps",
		Long: `Act on a Kipper app: a stateless workload of a project's environment. kip writes the app's
Kipper object and console-api runs it as the Deployment of the same name (docs/console.md,
docs/apps.md). Every command names the app with --project and --environment.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.AddCommand(
		newAppScaleCmd(f),
		newAppActionCmd(f, "stop", "Stop an app and wait until its pods are gone",
			"kip records the stop on the app (spec.stop, with its reason and time) and console-api scales the\n"+
				"app's Deployment to 0. The app stays stopped, also across upgrades, until 'kip app start'.", app.Stop),
		newAppActionCmd(f, "start", "Start a stopped app and wait until its pods are Ready",
			"The app starts at its stored count ('kip app scale'), or at its minimum when autoscaling is on.", app.Start),
		newAppActionCmd(f, "restart", "Roll an app's pods and wait until the new ones are Ready",
			"console-api rolls the app's pods as a Deployment's rollout replaces them, and kip waits until the\n"+
				"rollout has finished; new pod settings an upgrade brings apply at once. A stopped app is refused:\n"+
				"no pod of it runs ('kip app start' starts it).", app.Restart),
		newAppAutoscaleCmd(f),
		newAppActionCmd(f, "info", "Show an app's counts, autoscaling, stop and where its pods run", "", app.ShowInfo),
	)
	return cmd
}

// appFlags binds the flags that name an app.
func appFlags(cmd *cobra.Command, o *app.AppOptions) {
	fl := cmd.Flags()
	fl.StringVar(&o.Project, "project", "", "the app's project (required)")
	fl.StringVar(&o.Environment, "environment", "", "the project's environment, e.g. staging (required)")
	_ = cmd.MarkFlagRequired("project")
	_ = cmd.MarkFlagRequired("environment")
}

// newAppActionCmd is a kip app command on one app.
func newAppActionCmd(f *cli.Factory, use, short, long string, run func(context.Context, *app.AppOptions) error) *cobra.Command {
	o := &app.AppOptions{}
	text := short + "."
	if long != "" {
		text += "\n\n" + long
	}
	cmd := &cobra.Command{
		Use:     use + " APP --project P --environment E",
		Short:   short,
		Long:    text,
		Example: "  kip app " + use + " web --project shop --environment test",
		Args:    usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Options, o.Name = serviceOptions(f), args[0]
			return run(cmd.Context(), o)
		},
	}
	appFlags(cmd, o)
	return cmd
}

func newAppScaleCmd(f *cli.Factory) *cobra.Command {
	o := &app.ScaleOptions{}
	cmd := &cobra.Command{
		Use:   "scale APP --project P --environment E --replicas N",
		Short: "Set the count of pods an app runs",
		Long: `Set the app's stored count of pods (spec.replicas). The count lies within the app's autoscaling
bounds whether autoscaling is on or off: its minimum (1 when unset) and its maximum (none when
unset); 'kip app autoscale' changes them. An app runs no pod only while stopped ('kip app stop').

A running app without autoscaling runs the count once console-api has acted, and kip waits for
its pods. A stopped app keeps the count for its start. With autoscaling on, the autoscaler moves
the running count within the bounds; the app runs the stored count once autoscaling is off.`,
		Example: "  kip app scale worker --project shop --environment prod --replicas 3",
		Args:    usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Options, o.Name = serviceOptions(f), args[0]
			return app.Scale(cmd.Context(), o)
		},
	}
	appFlags(cmd, &o.AppOptions)
	cmd.Flags().IntVar(&o.Replicas, "replicas", 0, "the count of pods, within the app's autoscaling bounds (required)")
	_ = cmd.MarkFlagRequired("replicas")
	return cmd
}

func newAppAutoscaleCmd(f *cli.Factory) *cobra.Command {
	o := &app.AutoscaleOptions{}
	var min, max, cpu, memory int32
	cmd := &cobra.Command{
		Use:   "autoscale APP --project P --environment E (--min N --max M [--cpu-target P] [--memory-target P] | --off [--min N] [--max M])",
		Short: "Turn an app's autoscaling on with its bounds and targets, or off",
		Long: `Turn autoscaling on: an autoscaler moves the app's count of pods between --min and --max towards
a CPU or memory target (percent of the pods' requests). A flag not given keeps the stored value;
a target of 0 removes it. --off turns autoscaling off and keeps the bounds, which --min and --max
may change: the bounds hold the app's stored count whether autoscaling is on or off.

The rules: a minimum and a maximum of 1 or more, the minimum not above the maximum, a minimum
above 1 only with a maximum, and while autoscaling is on a maximum and a target above 0. kip
refuses settings that break one, naming it.

When the new bounds leave the stored count ('kip app scale') outside, the count moves to the
nearest bound in the same write and kip says so: a running app without autoscaling scales to it.`,
		Example: "  kip app autoscale web --project shop --environment prod --min 2 --max 5 --cpu-target 70\n" +
			"  kip app autoscale web --project shop --environment prod --off",
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Options, o.Name = serviceOptions(f), args[0]
			given := func(name string, v *int32) *int32 {
				if cmd.Flags().Changed(name) {
					return v
				}
				return nil
			}
			o.Min, o.Max, o.CPUTarget, o.MemoryTarget = given("min", &min), given("max", &max), given("cpu-target", &cpu), given("memory-target", &memory)
			return app.SetAutoscale(cmd.Context(), o)
		},
	}
	appFlags(cmd, &o.AppOptions)
	fl := cmd.Flags()
	fl.Int32Var(&min, "min", 0, "the fewest pods (the stored value when not given; 1 when unset)")
	fl.Int32Var(&max, "max", 0, "the most pods (the stored value when not given)")
	fl.Int32Var(&cpu, "cpu-target", 0, "target CPU use, in percent of the pods' request (0 removes it)")
	fl.Int32Var(&memory, "memory-target", 0, "target memory use, in percent of the pods' request (0 removes it)")
	fl.BoolVar(&o.Off, "off", false, "turn autoscaling off, keeping the bounds")
	return cmd
}
