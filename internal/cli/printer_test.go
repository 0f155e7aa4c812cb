package cli

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func streams(tty bool, env map[string]string) (*IOStreams, *bytes.Buffer) {
	var errOut bytes.Buffer
	getenv := func(k string) string { return env[k] }
	s := &IOStreams{In: strings.NewReader(""), Out: &bytes.Buffer{}, ErrOut: &errOut,
		StdinTTY: tty, StdoutTTY: tty, StderrTTY: tty, Getenv: getenv}
	s.Color = ColorEnabled(tty, getenv)
	return s, &errOut
}

func TestColorEnabled(t *testing.T) {
	tests := []struct {
		tty  bool
		env  map[string]string
		want bool
	}{
		{true, nil, true},
		{false, nil, false},
		{true, map[string]string{"NO_COLOR": "1"}, false},
		{true, map[string]string{"NO_COLOR": ""}, true},
		{false, map[string]string{"CLICOLOR_FORCE": "1"}, true},
		{false, map[string]string{"CLICOLOR_FORCE": "0"}, false},
		{true, map[string]string{"NO_COLOR": "1", "CLICOLOR_FORCE": "1"}, false},
		{true, map[string]string{"TERM": "dumb"}, false},
		{true, map[string]string{"TERM": "dumb", "CLICOLOR_FORCE": "1"}, true},
	}
	for _, tt := range tests {
		got := ColorEnabled(tt.tty, func(k string) string { return tt.env[k] })
		if got != tt.want {
			t.Errorf("ColorEnabled(tty=%v, %v) = %v, want %v", tt.tty, tt.env, got, tt.want)
		}
	}
}

func TestPrinterOffTTY(t *testing.T) {
	io, buf := streams(false, nil)
	p := NewPrinter(io)
	p.StepStarted("Install k3s")
	p.StepDone("Installed k3s", 41*time.Second)
	p.StepAlready("Longhorn already installed")
	p.StepFailed("Install Velero", errors.New("boom"))
	p.Planned("Install Traefik", []string{"create HelmChart kube-system/traefik"})
	p.Warn("disk low")
	want := "… Install k3s\n" +
		"✔ Installed k3s (41s)\n" +
		"✔ Longhorn already installed\n" +
		"✗ Install Velero: boom\n" +
		"~ Install Traefik\n" +
		"    create HelmChart kube-system/traefik\n" +
		"! disk low\n"
	if buf.String() != want {
		t.Fatalf("output:\n%q\nwant:\n%q", buf.String(), want)
	}
}

func TestPrinterOnTTY(t *testing.T) {
	io, buf := streams(true, nil)
	p := NewPrinter(io)
	p.StepStarted("Install k3s")
	time.Sleep(250 * time.Millisecond)
	p.StepDone("Installed k3s", 2*time.Minute+3*time.Second)
	out := buf.String()
	if !strings.Contains(out, "\r⠋ Install k3s") && !strings.Contains(out, "⠋") {
		t.Errorf("no spinner frame on a TTY: %q", out)
	}
	if !strings.Contains(out, "\r\033[K") {
		t.Errorf("spinner line not cleared: %q", out)
	}
	if !strings.Contains(out, "\033[32m✔") {
		t.Errorf("no colour on a TTY: %q", out)
	}
	if !strings.HasSuffix(out, "Installed k3s \033[2m(2m03s)\033[0m\n") {
		t.Errorf("done line: %q", out)
	}
}

func TestPrinterNoColorOnTTY(t *testing.T) {
	io, buf := streams(true, map[string]string{"NO_COLOR": "1"})
	NewPrinter(io).Success("ok")
	if strings.Contains(buf.String(), "\033[") {
		t.Fatalf("NO_COLOR output has escapes: %q", buf.String())
	}
}

func TestPrinterDumbTerminalHasNoSpinner(t *testing.T) {
	io, buf := streams(true, map[string]string{"TERM": "dumb"})
	p := NewPrinter(io)
	p.StepStarted("Wait")
	p.StepDone("Waited", time.Second)
	if strings.Contains(buf.String(), "\r") || strings.Contains(buf.String(), "\033[") {
		t.Fatalf("TERM=dumb output has control sequences: %q", buf.String())
	}
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		350 * time.Millisecond:                     "350ms",
		4200 * time.Millisecond:                    "4.2s",
		41 * time.Second:                           "41s",
		2*time.Minute + 3*time.Second:              "2m03s",
		time.Hour + 2*time.Minute + 29*time.Second: "1h02m",
	} {
		if got := FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestPrompter(t *testing.T) {
	tests := []struct {
		name        string
		interactive bool
		yes         bool
		input       string
		want        bool
		wantErr     error
	}{
		{"tty yes", true, false, "y\n", true, nil},
		{"tty YES", true, false, "YES\n", true, nil},
		{"tty enter defaults to no", true, false, "\n", false, nil},
		{"tty other word is no", true, false, "sure\n", false, nil},
		{"tty EOF is no", true, false, "", false, nil},
		{"no tty no --yes refuses", false, false, "y\n", false, ErrYesRequired},
		{"no tty --yes", false, true, "", true, nil},
		{"tty --yes needs no input", true, true, "", true, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			io, buf := streams(tt.interactive, nil)
			io.In = strings.NewReader(tt.input)
			p := NewPrompter(io, tt.yes)
			if err := p.CanConfirm(); !errors.Is(err, tt.wantErr) {
				t.Fatalf("CanConfirm() = %v, want %v", err, tt.wantErr)
			}
			got, err := p.Confirm("Restart k3s?")
			if !errors.Is(err, tt.wantErr) || got != tt.want {
				t.Fatalf("Confirm() = %v, %v; want %v, %v", got, err, tt.want, tt.wantErr)
			}
			if tt.wantErr == nil && !strings.Contains(buf.String(), "Restart k3s? [y/N]") {
				t.Fatalf("prompt not shown: %q", buf.String())
			}
		})
	}
}

// TestAsk: a consent --yes does not give is asked on a terminal even under --yes, and refused
// off one.
func TestAsk(t *testing.T) {
	for _, tt := range []struct {
		name        string
		interactive bool
		yes         bool
		input       string
		want        bool
		wantErr     error
	}{
		{"tty yes", true, false, "y\n", true, nil},
		{"tty no", true, false, "n\n", false, nil},
		{"tty --yes still asks", true, true, "\n", false, nil},
		{"no tty", false, false, "y\n", false, ErrNoTerminal},
		{"no tty --yes", false, true, "y\n", false, ErrNoTerminal},
	} {
		t.Run(tt.name, func(t *testing.T) {
			io, buf := streams(tt.interactive, nil)
			io.In = strings.NewReader(tt.input)
			got, err := NewPrompter(io, tt.yes).Ask("Apply these fixes?")
			if !errors.Is(err, tt.wantErr) || got != tt.want {
				t.Fatalf("Ask() = %v, %v; want %v, %v", got, err, tt.want, tt.wantErr)
			}
			if shown := strings.Contains(buf.String(), "Apply these fixes? [y/N]"); shown != tt.interactive {
				t.Fatalf("prompt shown = %v, want %v: %q", shown, tt.interactive, buf.String())
			}
		})
	}
}

func TestExitCode(t *testing.T) {
	for err, want := range map[error]int{
		nil:             ExitOK,
		errors.New("x"): ExitFailed,
		Usagef("bad"):   ExitUsage,
		ErrYesRequired:  ExitUsage,
		fmt.Errorf("fixes to apply: %w", ErrNoTerminal): ExitUsage,
		&DecisionError{Err: errors.New("findings")}:     ExitDecision,
	} {
		if got := ExitCode(err); got != want {
			t.Errorf("ExitCode(%v) = %d, want %d", err, got, want)
		}
	}
}
