package sshx

import (
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

func TestQuote(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "''"},
		{"abc", "abc"},
		{"/etc/kip/k3s.yaml", "/etc/kip/k3s.yaml"},
		{"user@host:22,x+y%z", "user@host:22,x+y%z"},
		{"--flag=value", "'--flag=value'"},
		{"a b", "'a b'"},
		{"it's", `'it'\''s'`},
		{"'", `''\'''`},
		{"$(reboot)", "'$(reboot)'"},
		{"~root", "'~root'"},
		{"a\nb", "'a\nb'"},
		{"*", "'*'"},
	} {
		if got := Quote(tc.in); got != tc.want {
			t.Errorf("Quote(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
	if got, want := Command("chown", "root:root", "/a b"), "chown root:root '/a b'"; got != want {
		t.Errorf("Command = %s, want %s", got, want)
	}
}

// quoteSeeds are strings a careless quoting helper would get wrong.
var quoteSeeds = []string{
	"", " ", "plain", "a b", "it's", "''", `\`, `\'`, `"`, "$HOME", "`id`", "$(id)", "a;b", "a|b",
	"a&b", "a\nb", "\t", "*", "?", "[a]", "~", "#x", "-n", "=", "a=b", "{a,b}", "!", "é 日本",
	"\x01\x7f\xff", "%s", "%%", "'\"'\"'",
}

// TestQuoteShell runs every seed through a real shell: printf must print it back unchanged.
func TestQuoteShell(t *testing.T) {
	var all []byte
	for b := 1; b < 256; b++ {
		all = append(all, byte(b))
	}
	for _, s := range append(quoteSeeds, string(all)) {
		out, err := exec.Command("/bin/sh", "-c", Command("printf", "%s", s)).Output()
		if err != nil {
			t.Fatalf("sh -c %s: %v", Command("printf", "%s", s), err)
		}
		if string(out) != s {
			t.Errorf("sh printed %q for %q (quoted %s)", out, s, Quote(s))
		}
	}
}

// FuzzQuote checks that a command line built by Command splits back into its words, and that
// nothing a shell would interpret is left outside quotes.
func FuzzQuote(f *testing.F) {
	for _, s := range quoteSeeds {
		f.Add(s, "x")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		if strings.ContainsRune(a+b, 0) {
			return // a shell word cannot hold NUL
		}
		line := Command(a, b)
		words, err := splitWords(line)
		if err != nil {
			t.Fatalf("Command(%q, %q) = %s: %v", a, b, line, err)
		}
		if !slices.Equal(words, []string{a, b}) {
			t.Fatalf("Command(%q, %q) = %s splits into %q", a, b, line, words)
		}
	})
}

// splitWords splits a command line into words the way a POSIX shell would, for the subset of
// shell syntax Quote produces: plain characters, '...' and \x, words separated by spaces. Any
// other character a shell treats specially is an error.
func splitWords(line string) ([]string, error) {
	const special = "\t\n|&;<>()$`\"*?[]#~=!{}"
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(line); i++ {
		switch ch := line[i]; {
		case ch == ' ':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case ch == '\'':
			end := strings.IndexByte(line[i+1:], '\'')
			if end < 0 {
				return nil, errors.New("unterminated quote")
			}
			cur.WriteString(line[i+1 : i+1+end])
			i += end + 1
			inWord = true
		case ch == '\\':
			if i+1 == len(line) {
				return nil, errors.New("trailing backslash")
			}
			i++
			cur.WriteByte(line[i])
			inWord = true
		case strings.IndexByte(special, ch) >= 0:
			return nil, errors.New("unquoted special character " + string(ch))
		default:
			cur.WriteByte(ch)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}
