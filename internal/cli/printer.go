package cli

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/charmbracelet/lipgloss"
	"github.com/muesli/termenv"
)

// Glyphs lead every status line, so the words read the same with colour off.
const (
	GlyphOK      = "✔"
	GlyphWarn    = "!"
	GlyphFail    = "✗"
	GlyphWorking = "…"
	GlyphPlan    = "~"
)

// Printer writes progress and status as glyph + words to the error stream. It is the one
// place kip formats human output; internal packages report through it, never with fmt.Print.
// It implements workflow.Reporter.
type Printer struct {
	w       io.Writer
	spin    bool // animate a spinner: only when the stream is a terminal
	ok      lipgloss.Style
	warn    lipgloss.Style
	fail    lipgloss.Style
	faint   lipgloss.Style
	bold    lipgloss.Style
	mu      sync.Mutex
	spinner *spinner
}

// NewPrinter returns a printer on io's error stream.
func NewPrinter(io *IOStreams) *Printer {
	profile := termenv.Ascii
	if io.Color {
		profile = termenv.ANSI
	}
	r := lipgloss.NewRenderer(io.ErrOut)
	r.SetColorProfile(profile) // decided by ColorEnabled, never by probing the terminal
	return &Printer{
		w:     io.ErrOut,
		spin:  io.StderrTTY && io.Getenv("TERM") != "dumb",
		ok:    r.NewStyle().Foreground(lipgloss.Color("2")),
		warn:  r.NewStyle().Foreground(lipgloss.Color("3")),
		fail:  r.NewStyle().Foreground(lipgloss.Color("1")),
		faint: r.NewStyle().Faint(true),
		bold:  r.NewStyle().Bold(true),
	}
}

// line writes one status line, clearing a running spinner first.
func (p *Printer) line(glyph lipgloss.Style, g, msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopSpinnerLocked()
	fmt.Fprintf(p.w, "%s %s\n", glyph.Render(g), msg)
}

// Success prints "✔ msg".
func (p *Printer) Success(msg string) { p.line(p.ok, GlyphOK, msg) }

// Warn prints "! msg".
func (p *Printer) Warn(msg string) { p.line(p.warn, GlyphWarn, msg) }

// Fail prints "✗ msg".
func (p *Printer) Fail(msg string) { p.line(p.fail, GlyphFail, msg) }

// Info prints an indented line of plain words.
func (p *Printer) Info(msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopSpinnerLocked()
	fmt.Fprintf(p.w, "  %s\n", msg)
}

// Debug prints a faint diagnostic line (kip -v), clearing a running spinner first so that the
// two never write over each other.
func (p *Printer) Debug(msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopSpinnerLocked()
	fmt.Fprintf(p.w, "  %s\n", p.faint.Render(msg))
}

// StepStarted shows that work has begun: a spinner on a terminal, a "… title" line elsewhere
// so that logs show what was running when something hung.
func (p *Printer) StepStarted(title string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopSpinnerLocked()
	if p.spin {
		p.spinner = startSpinner(p.w, p.faint, title)
		return
	}
	fmt.Fprintf(p.w, "%s %s\n", p.faint.Render(GlyphWorking), title)
}

// StepDone prints "✔ msg (41s)".
func (p *Printer) StepDone(msg string, d time.Duration) {
	p.line(p.ok, GlyphOK, msg+" "+p.faint.Render("("+FormatDuration(d)+")"))
}

// StepAlready prints a step that needed no change, visibly quieter than one that did work.
func (p *Printer) StepAlready(msg string) { p.line(p.faint, GlyphOK, p.faint.Render(msg)) }

// StepFailed prints "✗ title: err" (a title that is a sentence loses its full stop).
func (p *Printer) StepFailed(title string, err error) {
	p.line(p.fail, GlyphFail, fmt.Sprintf("%s: %v", strings.TrimSuffix(title, "."), err))
}

// Planned prints what a step would change in a dry run.
func (p *Printer) Planned(title string, changes []string) {
	p.line(p.warn, GlyphPlan, title)
	for _, c := range changes {
		p.Info("  " + c)
	}
}

// Bold renders s in bold when colour is on.
func (p *Printer) Bold(s string) string { return p.bold.Render(s) }

func (p *Printer) stopSpinnerLocked() {
	if p.spinner != nil {
		p.spinner.stop()
		p.spinner = nil
	}
}

// FormatDuration renders a step's duration the way people read it: 350ms, 4.2s, 41s, 2m03s, 1h02m.
func FormatDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < 10*time.Second:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Round(time.Second).Seconds()))
	case d < time.Hour:
		d = d.Round(time.Second)
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	default:
		d = d.Round(time.Minute)
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
}

type spinner struct {
	done chan struct{}
	wg   sync.WaitGroup
	w    io.Writer
}

var spinnerFrames = []string{"⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"}

func startSpinner(w io.Writer, style lipgloss.Style, title string) *spinner {
	s := &spinner{done: make(chan struct{}), w: w}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for i := 0; ; i++ {
			fmt.Fprintf(w, "\r%s %s", style.Render(spinnerFrames[i%len(spinnerFrames)]), title)
			select {
			case <-s.done:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// stop ends the animation and erases its line.
func (s *spinner) stop() {
	close(s.done)
	s.wg.Wait()
	fmt.Fprint(s.w, "\r\033[K")
}

// Plural is one when n is 1, else many.
func Plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
