package main

import (
	"github.com/spf13/cobra"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/install"
)

func newPlatformCmd(f *cli.Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "platform",
		Short: "Turn optional platform components on and off, and change the sizing profile",
		Args:  usageArgs(cobra.NoArgs),
		RunE:  func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newPlatformSwitchCmd(f, true), newPlatformSwitchCmd(f, false), newPlatformProfileCmd(f), newPlatformVersionsCmd(f, nil))
	return cmd
}

func newPlatformSwitchCmd(f *cli.Factory, on bool) *cobra.Command {
	use, short := "enable", "Turn on Prometheus (with Grafana) or Loki, when the server has room"
	if !on {
		use, short = "disable", "Turn off Prometheus (with Grafana) or Loki, deleting their data"
	}
	return &cobra.Command{
		Use:       use + " prometheus|loki",
		Short:     short,
		Example:   "  kip platform " + use + " prometheus",
		ValidArgs: []string{install.PlatformPrometheus, install.PlatformLoki},
		Args:      usageArgs(cobra.MatchAll(cobra.ExactArgs(1), cobra.OnlyValidArgs)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return install.SetMonitoring(cmd.Context(), f, args[0], on)
		},
	}
}

func newPlatformProfileCmd(f *cli.Factory) *cobra.Command {
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
		RunE:  func(cmd *cobra.Command, args []string) error { return install.ShowProfile(cmd.Context(), f) },
	}, &cobra.Command{
		Use:     "set nano|small|standard|large",
		Short:   "Change the cluster's sizing profile; one the server cannot carry is refused",
		Example: "  kip platform profile set small",
		Args:    usageArgs(cobra.ExactArgs(1)),
		RunE:    func(cmd *cobra.Command, args []string) error { return install.SetProfile(cmd.Context(), f, args[0]) },
	})
	return cmd
}
