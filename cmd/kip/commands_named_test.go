package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// namedCommands finds the kip commands that kip's messages and docs tell an operator to run: in
// Go source (not tests), each 'kip …' in single quotes; in Markdown, each `kip …` in backticks
// and each line of a code block that starts with kip.
var (
	quoted   = regexp.MustCompile(`'(kip [^'\n]+)'`)
	inCode   = regexp.MustCompile("`(kip [^`\n]+)`")
	flagWord = regexp.MustCompile(`^--[a-z][a-z0-9-]*`)
	bare     = regexp.MustCompile("\\bkip ([^'\"`;,:()\\n\\\\]+)")
	// commandLike is a word that reads as a command name, not as prose ("restore-dump").
	commandLike = regexp.MustCompile(`^[a-z]+(-[a-z]+)+$`)
	plainWord   = regexp.MustCompile(`^[a-z]+$`)
)

// notYet are commands kip's messages and docs name that kip does not have yet, each with the
// work that builds it. The test fails once one exists, so that it leaves this list.
var notYet = map[string]string{
	"kip upgrade --longhorn": "issues 31 and 33: kip upgrade, and its Longhorn steps",
}

// TestCommandsKipNamesExist checks that every kip command kip's messages and docs name is a
// command kip has, with flags that command takes: a message that names a command that does not
// work as written sends an operator nowhere.
func TestCommandsKipNamesExist(t *testing.T) {
	f, _, _ := testFactory(nil)
	root := newRootCmd(f)
	named := map[string][]string{}     // command line → where
	bareNamed := map[string][]string{} // the same, unquoted in Go source: prose may follow it
	add := func(line, where string) { named[line] = append(named[line], where) }
	for _, dir := range []string{"../../internal", "../../cmd"} {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range quoted.FindAllStringSubmatch(string(data), -1) {
				// A quoted phrase that goes on after the quote ("'kip is moving ' + …") is a
				// sentence, not a command line.
				if !strings.HasSuffix(m[1], " ") {
					add(m[1], path)
				}
			}
			// Unquoted in a message or a comment: "kip " and a command kip has, up to the end
			// of the phrase.
			for _, m := range bare.FindAllStringSubmatch(string(data), -1) {
				for _, part := range strings.Split(m[1], " kip ") {
					if first, _, _ := strings.Cut(part, " "); findSub(root, first) != nil {
						line := strings.TrimRight("kip "+part, ". ")
						bareNamed[line] = append(bareNamed[line], path)
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range append(docs, "../../README.md") {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		block := false
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				block = !block
				continue
			}
			if block {
				// A command line starts the line (a diagram's indented "kip …" is none).
				if l := strings.TrimSpace(strings.TrimPrefix(line, "$ ")); strings.HasPrefix(strings.TrimPrefix(line, "$ "), "kip ") {
					add(l, path)
				}
				continue
			}
			for _, m := range inCode.FindAllStringSubmatch(line, -1) {
				add(m[1], path)
			}
		}
	}
	if len(named) < 50 {
		t.Fatalf("found only %d kip commands named in messages and docs: the search is broken", len(named))
	}
	check := func(lines map[string][]string, prose bool) {
		for line, where := range lines {
			why := checkNamed(root, line, prose)
			if why == "" {
				continue
			}
			if w := strings.Fields(line); len(w) >= 3 && notYet[strings.Join(w[:3], " ")] != "" {
				continue
			}
			t.Errorf("%q (in %s): %s", line, strings.Join(where, ", "), why)
		}
	}
	check(named, false)
	check(bareNamed, true)
	for line, work := range notYet {
		if checkNamed(root, line, false) == "" {
			t.Errorf("%q exists now (%s): take it off notYet", line, work)
		}
	}
}

// checkNamed finds the command line names and checks its flags, returning what is wrong, or ""
// when nothing is or the line cannot be judged (a format verb where a command word goes). In
// prose, the command ends at the first plain word that is neither a command nor a flag.
func checkNamed(root *cobra.Command, line string, prose bool) string {
	words := strings.Fields(line)[1:]
	if prose {
		for i, w := range words {
			words[i] = strings.TrimRight(w, ".")
		}
	}
	cmd := root
	i := 0
	for ; i < len(words); i++ {
		w := words[i]
		if strings.Contains(w, "%") || strings.HasPrefix(w, "<") || strings.HasPrefix(w, "$") || strings.Contains(w, "…") {
			return "" // filled in when the message is made
		}
		if strings.HasPrefix(w, "-") {
			break
		}
		// a|b names either command: the first stands for both.
		w, _, _ = strings.Cut(w, "|")
		next := findSub(cmd, w)
		if next == nil {
			break
		}
		cmd = next
	}
	if cmd == root {
		return "no such command"
	}
	if cmd.HasAvailableSubCommands() && !cmd.Runnable() {
		return "names command group '" + cmd.CommandPath() + "', which needs one of its commands"
	}
	// A word after a command that has commands of its own, and takes no such argument, names
	// one it does not have.
	if i < len(words) && !strings.HasPrefix(words[i], "-") && cmd.HasAvailableSubCommands() && cmd.ValidateArgs(words[i:i+1]) != nil &&
		(!prose || commandLike.MatchString(words[i])) {
		return "'" + cmd.CommandPath() + "' has no command " + words[i]
	}
	for j, w := range words[i:] {
		m := flagWord.FindString(w)
		if m == "" {
			if prose && j > 0 && plainWord.MatchString(w) && !strings.HasPrefix(words[i+j-1], "-") {
				break // the sentence goes on
			}
			continue
		}
		name := strings.TrimPrefix(m, "--")
		if name == "help" {
			continue // every command takes it
		}
		if cmd.Flags().Lookup(name) == nil && cmd.InheritedFlags().Lookup(name) == nil && !inherited(cmd, name) {
			return "'" + cmd.CommandPath() + "' has no flag --" + name
		}
	}
	return ""
}

func findSub(cmd *cobra.Command, name string) *cobra.Command {
	for _, c := range cmd.Commands() {
		if c.Name() == name || c.HasAlias(name) {
			return c
		}
	}
	return nil
}

// inherited reports whether a parent of cmd has the persistent flag name.
func inherited(cmd *cobra.Command, name string) bool {
	found := false
	for c := cmd; c != nil; c = c.Parent() {
		c.PersistentFlags().VisitAll(func(f *pflag.Flag) {
			if f.Name == name {
				found = true
			}
		})
	}
	return found
}
