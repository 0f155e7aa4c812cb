// Command kip turns an operator's own Linux servers into a Kipper cluster and keeps it healthy.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"

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
	err := root.ExecuteContext(ctx)
	if err != nil {
		printError(streams, err)
	}
	return cli.ExitCode(err)
}

func printError(streams *cli.IOStreams, err error) {
	if errors.Is(err, stop.ErrInterrupted) {
		return // the step runner already said where it stopped and how to continue
	}
	var usage *cli.UsageError
	fmt.Fprintf(streams.ErrOut, "error: %v\n", err)
	if errors.As(err, &usage) {
		fmt.Fprintln(streams.ErrOut, "Run 'kip --help' for usage.")
	}
}
