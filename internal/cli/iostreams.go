package cli

import (
	"io"
	"os"

	"golang.org/x/term"
)

// IOStreams are the standard streams of one kip invocation and what is known about them.
// Data goes to Out; progress, status and prompts go to ErrOut.
type IOStreams struct {
	In     io.Reader
	Out    io.Writer
	ErrOut io.Writer

	StdinTTY  bool
	StdoutTTY bool
	StderrTTY bool

	// Color is decided once, from the environment and whether ErrOut is a terminal.
	Color bool
	// Getenv reads the environment; tests replace it.
	Getenv func(string) string
}

// System returns the process's streams.
func System() *IOStreams {
	s := &IOStreams{
		In:        os.Stdin,
		Out:       os.Stdout,
		ErrOut:    os.Stderr,
		StdinTTY:  isTerminal(os.Stdin),
		StdoutTTY: isTerminal(os.Stdout),
		StderrTTY: isTerminal(os.Stderr),
		Getenv:    os.Getenv,
	}
	s.Color = ColorEnabled(s.StderrTTY, s.Getenv)
	return s
}

func isTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }

// ColorEnabled applies the conventions of no-color.org and bixense.com/clicolors:
// a non-empty NO_COLOR disables colour, TERM=dumb disables it, a CLICOLOR_FORCE other than
// "" or "0" forces it, and otherwise colour follows whether the stream is a terminal.
func ColorEnabled(tty bool, getenv func(string) string) bool {
	if getenv("NO_COLOR") != "" {
		return false
	}
	if f := getenv("CLICOLOR_FORCE"); f != "" && f != "0" {
		return true
	}
	if getenv("TERM") == "dumb" {
		return false
	}
	return tty
}
