package main

import (
	"github.com/spf13/cobra"

	"kipper.run/kip/internal/cli"
)

// usageArgs makes a positional-argument check's error a usage error (exit 2).
func usageArgs(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return &cli.UsageError{Err: err}
		}
		return nil
	}
}
