// Command kip turns an operator's own Linux servers into a Kipper cluster and keeps it healthy.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/stop"
)

func main() {
	os.Exit(run())
}

// run executes kip and maps its outcome to an exit code; this is the only place that does.
func run() int {
	streams := cli.System()
	f := cli.NewFactory(streams)
	ctx, release := stop.OnSignals(context.Background(), func(first bool) {
		if first {
			fmt.Fprintln(streams.ErrOut, "\nStopping after the current remote command (Ctrl-C again to abort now)...")
		}
	})
	defer release()

	defer f.Close()

	root := newRootCmd(f)
	cmd, err := root.ExecuteContextC(ctx)
	if err != nil {
		printError(streams, cmd, err)
	}
	return cli.ExitCode(err)
}

// printError prints err; a usage error is followed by the help of the command that failed
// (cmd, as cobra found it from the arguments; nil for kip itself).
func printError(streams *cli.IOStreams, cmd *cobra.Command, err error) {
	if errors.Is(err, stop.ErrInterrupted) {
		return // the step runner already said where it stopped and how to continue
	}
	var usage *cli.UsageError
	fmt.Fprintf(streams.ErrOut, "error: %v\n", err)
	if errors.As(err, &usage) {
		fmt.Fprintln(streams.ErrOut, usageHint(cmd))
	}
}

// usageHint points to the help of the command that failed: "Run 'kip install --help' for usage."
func usageHint(cmd *cobra.Command) string {
	path := "kip"
	if cmd != nil {
		path = cmd.CommandPath()
	}
	return fmt.Sprintf("Run '%s --help' for usage.", path)
}
