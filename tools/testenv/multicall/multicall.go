// Package multicall runs one of several commands linked into one binary, chosen by the name
// the binary was started under (a link named after the command), as k3s's binary does.
package multicall

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Main runs the command named by os.Args[0]'s base name, or else by os.Args[1] (then dropped
// from os.Args), as in "testenv-control kubectl version". It exits with the command's status.
func Main(self string, commands map[string]func() int) {
	name := filepath.Base(os.Args[0])
	if _, ok := commands[name]; !ok && len(os.Args) > 1 {
		name = os.Args[1]
		os.Args = append([]string{name}, os.Args[2:]...)
	}
	run, ok := commands[name]
	if !ok {
		names := make([]string, 0, len(commands))
		for n := range commands {
			names = append(names, n)
		}
		slices.Sort(names)
		fmt.Fprintf(os.Stderr, "%s: no command %q; run it as one of: %s\n", self, name, strings.Join(names, ", "))
		os.Exit(2)
	}
	os.Exit(run())
}
