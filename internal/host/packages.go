package host

import (
	"fmt"
	"strings"

	"kipper.run/kip/internal/sshx"
)

// MissingPackagesCommand returns a command that prints, one per line, those of pkgs that are
// not installed, and nothing when all are.
func (f Family) MissingPackagesCommand(pkgs []string) string {
	return fmt.Sprintf(`for p in %s; do %s || echo "$p"; done`, quoteAll(pkgs), f.installed)
}

// InstallPackagesCommand returns a command that installs pkgs without prompting.
func (f Family) InstallPackagesCommand(pkgs []string) string {
	return f.install + " " + quoteAll(pkgs)
}

func quoteAll(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = sshx.Quote(w)
	}
	return strings.Join(q, " ")
}
