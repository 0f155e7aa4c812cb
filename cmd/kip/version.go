package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"kipper.run/kip/internal/buildinfo"
	"kipper.run/kip/internal/cli"
	"kipper.run/kip/manifests"
)

// VersionOutput is the documented shape of 'kip version -o json'.
type VersionOutput struct {
	Kip        KipVersion            `json:"kip"`
	Kubernetes string                `json:"kubernetes"`
	Components []manifests.Component `json:"components"`
}

// KipVersion is kip's own version and the commit it was built from.
type KipVersion struct {
	Version string `json:"version"`
	Commit  string `json:"commit"`
}

func newVersionCmd(f *cli.Factory, runF func(*VersionOutput) error) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print kip's version and the component versions it pins",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			pinned, err := manifests.Pinned()
			if err != nil {
				return err
			}
			out := &VersionOutput{
				Kip:        KipVersion{Version: buildinfo.Version, Commit: buildinfo.Commit},
				Kubernetes: pinned.Kubernetes,
				Components: pinned.Components,
			}
			if runF != nil {
				return runF(out)
			}
			return printVersion(f, out)
		},
	}
}

func printVersion(f *cli.Factory, v *VersionOutput) error {
	w := f.IO.Out
	if f.Global.Output == cli.OutputJSON {
		return cli.WriteJSON(w, v)
	}
	fmt.Fprintf(w, "kip %s (commit %s)\n", v.Kip.Version, v.Kip.Commit)
	fmt.Fprintln(w, "Pinned by this kip:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  kubernetes\t%s\n", v.Kubernetes)
	for _, c := range v.Components {
		fmt.Fprintf(tw, "  %s\t%s\n", c.Name, c.Version)
	}
	return tw.Flush()
}
