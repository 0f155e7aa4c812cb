package cli

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
)

// TestRealTerminal runs a helper process on a real pseudo-terminal and checks that kip's
// streams detect it: colour and a spinner on the terminal, a prompt that reads an answer;
// NO_COLOR still turns colour off there.
func TestRealTerminal(t *testing.T) {
	for _, tt := range []struct {
		name      string
		env       []string
		wantColor bool
	}{
		{"tty", nil, true},
		{"tty NO_COLOR", []string{"NO_COLOR=1"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), append(tt.env, "KIP_TERMINAL_HELPER=1", "TERM=xterm")...)
			f, err := pty.Start(cmd)
			if err != nil {
				t.Fatalf("start on a pty: %v", err)
			}
			defer f.Close()
			var out bytes.Buffer
			done := make(chan struct{})
			go func() { io.Copy(&out, f); close(done) }() //nolint:errcheck // EIO when the child exits
			time.Sleep(500 * time.Millisecond)
			if _, err := f.Write([]byte("y\n")); err != nil {
				t.Fatal(err)
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("helper: %v\n%s", err, out.String())
			}
			<-done
			s := out.String()
			if !strings.Contains(s, "tty=true") {
				t.Fatalf("terminal not detected:\n%q", s)
			}
			if !strings.Contains(s, "answer=true") {
				t.Fatalf("prompt did not read the answer:\n%q", s)
			}
			if !strings.Contains(s, "\r\033[K") {
				t.Errorf("no spinner on a terminal:\n%q", s)
			}
			if got := strings.Contains(s, "\033[32m"); got != tt.wantColor {
				t.Errorf("colour = %v, want %v:\n%q", got, tt.wantColor, s)
			}
		})
	}
}

// TestMain runs the binary as TestRealTerminal's helper on the terminal it was given, when its
// environment says so.
func TestMain(m *testing.M) {
	if os.Getenv("KIP_TERMINAL_HELPER") != "" {
		io := System()
		p := NewPrinter(io)
		p.StepStarted("Working")
		time.Sleep(150 * time.Millisecond)
		p.StepDone("Worked", time.Second)
		ok, err := NewPrompter(io, false).Confirm("Go on?")
		fmt.Fprintf(os.Stderr, "tty=%v answer=%v err=%v\n", io.StdinTTY && io.StderrTTY, ok, err)
		os.Exit(0)
	}
	os.Exit(m.Run())
}
