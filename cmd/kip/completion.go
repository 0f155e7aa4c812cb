package main

import (
	"github.com/spf13/cobra"

	"kipper.run/kip/internal/cli"
)

func newCompletionCmd(f *cli.Factory) *cobra.Command {
	return &cobra.Command{
		Use:   "completion bash|zsh|fish",
		Short: "Print a shell completion script",
		Long: `Print a completion script for your shell. For example:

  kip completion bash > /etc/bash_completion.d/kip
  kip completion zsh > "${fpath[1]}/_kip"
  kip completion fish > ~/.config/fish/completions/kip.fish`,
		ValidArgs: []string{"bash", "zsh", "fish"},
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return cli.Usagef("completion needs one shell: bash, zsh or fish")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			root, out := cmd.Root(), f.IO.Out
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(out, true)
			case "zsh":
				return root.GenZshCompletion(out)
			case "fish":
				return root.GenFishCompletion(out, true)
			default:
				return cli.Usagef("unsupported shell %q: use bash, zsh or fish", args[0])
			}
		},
	}
}
