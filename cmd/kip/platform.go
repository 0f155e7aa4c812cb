package main

import (
	"github.com/spf13/cobra"

	"kipper.run/kip/internal/buildinfo"
	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/platform"
)

func newPlatformCmd(f *cli.Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "platform",
		Short: "Turn optional platform components on and off, change the sizing profile, show versions",
		Args:  usageArgs(cobra.NoArgs),
		RunE:  func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newPlatformSwitchCmd(f, true, nil), newPlatformSwitchCmd(f, false, nil), newPlatformProfileCmd(f, nil, nil), newPlatformVersionsCmd(f, nil))
	return cmd
}

// platformOptions fills what every kip platform command needs from the factory.
func platformOptions(f *cli.Factory) platform.Options {
	return platform.Options{
		Kube: f.Kube, Printer: f.Printer(), Prompter: f.Prompter(), Holder: f.CommandLine(),
		KipVersion: buildinfo.Version, JSON: f.Global.Output == cli.OutputJSON, Out: f.IO.Out,
	}
}

func newPlatformSwitchCmd(f *cli.Factory, on bool, runF func(*platform.MonitoringOptions) error) *cobra.Command {
	use, short := "enable", "Turn on Prometheus (with Grafana) or Loki, when the server has room"
	if !on {
		use, short = "disable", "Turn off Prometheus (with Grafana) or Loki, deleting their data"
	}
	return &cobra.Command{
		Use:       use + " prometheus|loki",
		Short:     short,
		Example:   "  kip platform " + use + " prometheus",
		ValidArgs: []string{platform.PlatformPrometheus, platform.PlatformLoki},
		Args:      usageArgs(cobra.MatchAll(cobra.ExactArgs(1), cobra.OnlyValidArgs)),
		RunE: func(cmd *cobra.Command, args []string) error {
			o := &platform.MonitoringOptions{Options: platformOptions(f), Component: args[0], On: on}
			if runF != nil {
				return runF(o)
			}
			return platform.SetMonitoring(cmd.Context(), o)
		},
	}
}

func newPlatformProfileCmd(f *cli.Factory, showF func(*platform.Options) error, setF func(*platform.ProfileOptions) error) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "profile",
		Short: "Show or change the cluster's sizing profile",
		Args:  usageArgs(cobra.NoArgs),
		RunE:  func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "show",
		Short: "Show the cluster's sizing profile, what it sizes, and the server's size",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			o := platformOptions(f)
			if showF != nil {
				return showF(&o)
			}
			return platform.ShowProfile(cmd.Context(), &o)
		},
	}, &cobra.Command{
		Use:     "set nano|small|standard|large",
		Short:   "Change the cluster's sizing profile; one the server cannot carry is refused",
		Example: "  kip platform profile set small",
		Args:    usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			o := &platform.ProfileOptions{Options: platformOptions(f), Profile: args[0]}
			if setF != nil {
				return setF(o)
			}
			return platform.SetProfile(cmd.Context(), o)
		},
	})
	return cmd
}
