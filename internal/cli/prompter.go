package cli

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"
)

// ErrYesRequired refuses a destructive step when nobody can answer a prompt.
var ErrYesRequired = errors.New("--yes is required when not running interactively")

// ErrNoTerminal refuses a question that --yes does not answer (its own flag does) when there is
// no terminal to ask it on.
var ErrNoTerminal = errors.New("there is no terminal to ask on")

// Prompter asks yes/no questions on a terminal. The default answer is always No.
type Prompter struct {
	in          *bufio.Reader
	out         io.Writer
	interactive bool
	assumeYes   bool
}

// NewPrompter returns a prompter that reads io.In when stdin and stderr are terminals, and
// answers yes by itself when assumeYes (--yes) is set.
func NewPrompter(io *IOStreams, assumeYes bool) *Prompter {
	return &Prompter{
		in:          bufio.NewReader(io.In),
		out:         io.ErrOut,
		interactive: io.StdinTTY && io.StderrTTY,
		assumeYes:   assumeYes,
	}
}

// CanConfirm refuses up front, before any connection is made, when a later Confirm could not
// be answered: not interactive and no --yes.
func (p *Prompter) CanConfirm() error {
	if p.assumeYes || p.interactive {
		return nil
	}
	return ErrYesRequired
}

// Consent asks question on a terminal even under --yes, for a decision --yes must not make
// (accepting older data); off a terminal it answers No without asking.
func (p *Prompter) Consent(question string) (bool, error) {
	if !p.interactive {
		return false, nil
	}
	return p.ask(question)
}

// Ask asks question on a terminal even under --yes, for a consent that its own flag gives rather
// than --yes (the caller checks that flag first); off a terminal it returns ErrNoTerminal.
func (p *Prompter) Ask(question string) (bool, error) {
	if !p.interactive {
		return false, ErrNoTerminal
	}
	return p.ask(question)
}

// Confirm asks question and returns true only on an explicit yes. With --yes it answers yes
// and says so; off a terminal without --yes it returns ErrYesRequired.
func (p *Prompter) Confirm(question string) (bool, error) {
	if p.assumeYes {
		fmt.Fprintf(p.out, "%s [y/N] yes (--yes)\n", question)
		return true, nil
	}
	if !p.interactive {
		return false, ErrYesRequired
	}
	return p.ask(question)
}

// ask asks question on the terminal; only an explicit yes is true.
func (p *Prompter) ask(question string) (bool, error) {
	fmt.Fprintf(p.out, "%s [y/N] ", question)
	line, err := p.in.ReadString('\n')
	if err != nil && line == "" {
		fmt.Fprintln(p.out)
		if errors.Is(err, io.EOF) {
			return false, nil
		}
		return false, fmt.Errorf("read answer: %w", err)
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true, nil
	default:
		return false, nil
	}
}
