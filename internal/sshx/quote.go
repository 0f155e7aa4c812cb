package sshx

import "strings"

// Quote returns s as one POSIX shell word. Words made only of characters that no shell treats
// specially are returned as they are, which keeps commands readable in messages; anything else
// is single-quoted, each embedded single quote ending the quoted run, escaped with a backslash,
// and a new run starting after it. A shell word cannot carry a NUL byte, so s must not contain
// one.
func Quote(s string) string {
	if s == "" {
		return "''"
	}
	if strings.IndexFunc(s, needsQuoting) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// needsQuoting reports whether r may mean something to a shell. '=' and '~' are special only in
// some positions (an assignment before a command, a tilde prefix) but are quoted everywhere.
func needsQuoting(r rune) bool {
	switch {
	case 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z', '0' <= r && r <= '9':
		return false
	}
	return !strings.ContainsRune("_@%+:,./-", r)
}

// Command returns a shell command line that runs name with args, each quoted with Quote.
func Command(name string, args ...string) string {
	words := make([]string, 0, 1+len(args))
	words = append(words, Quote(name))
	for _, a := range args {
		words = append(words, Quote(a))
	}
	return strings.Join(words, " ")
}

// QuoteAll returns words as shell words (Quote), separated by spaces.
func QuoteAll(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = Quote(w)
	}
	return strings.Join(q, " ")
}
