package sshx

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Sections splits the output of a host script that starts each section with a line
// "MARKER NAME" preceded by a newline (so that a section whose output lacks a final newline
// cannot swallow the next header). With names, each must appear exactly once and no other;
// with nil names any section may appear, once. Text before the first section (a login banner)
// is ignored, and a section's text is kept as printed.
func Sections(out, marker string, names []string) (map[string]string, error) {
	parts := strings.Split(out, "\n"+marker+" ")
	if len(parts) < 2 {
		return nil, errors.New("no sections in the output")
	}
	s := make(map[string]string, len(parts)-1)
	for _, part := range parts[1:] {
		name, body, _ := strings.Cut(part, "\n")
		if names != nil && !slices.Contains(names, name) {
			return nil, fmt.Errorf("unexpected section %q", name)
		}
		if _, dup := s[name]; dup {
			return nil, fmt.Errorf("section %q appears twice", name)
		}
		s[name] = body
	}
	for _, name := range names {
		if _, ok := s[name]; !ok {
			return nil, fmt.Errorf("section %q is missing", name)
		}
	}
	return s, nil
}

// Lines returns the non-blank lines of s, trimmed.
func Lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// Properties reads "Key=Value" lines, as systemctl show prints them; rest are the lines that are
// not, in order (an error systemctl printed instead).
func Properties(s string) (props map[string]string, rest []string) {
	props = map[string]string{}
	for _, l := range Lines(s) {
		if k, v, ok := strings.Cut(l, "="); ok {
			props[k] = v
		} else {
			rest = append(rest, l)
		}
	}
	return props, rest
}
