package host

import (
	"context"
	"fmt"
	"strings"

	"kipper.run/kip/internal/sshx"
)

// MissingPackagesCommand returns a command that prints, one per line, those of pkgs that are
// not installed, and nothing when all are.
func (f Family) MissingPackagesCommand(pkgs []string) string {
	return fmt.Sprintf(`for p in %s; do %s || echo "$p"; done`, sshx.QuoteAll(pkgs), f.installed)
}

// InstallPackagesCommand returns a command that installs pkgs without prompting.
func (f Family) InstallPackagesCommand(pkgs []string) string {
	return f.install + " " + sshx.QuoteAll(pkgs)
}

// MissingPackages returns those of pkgs that are not installed on the host, in one round trip.
func (f Family) MissingPackages(ctx context.Context, c *sshx.Client, pkgs []string) ([]string, error) {
	if len(pkgs) == 0 {
		return nil, nil
	}
	out, err := c.Query(ctx, f.MissingPackagesCommand(pkgs))
	if err != nil {
		return nil, fmt.Errorf("check packages: %w", err)
	}
	return strings.Fields(string(out)), nil
}

// InstallPackages installs pkgs with the family's package manager, without prompting (with apt,
// refreshing package lists older than a day first).
func (f Family) InstallPackages(ctx context.Context, c *sshx.Client, pkgs []string) error {
	if len(pkgs) == 0 {
		return nil
	}
	res, err := c.Run(ctx, f.InstallPackagesCommand(pkgs))
	if err == nil {
		err = res.Err()
	}
	if err != nil {
		return fmt.Errorf("install %s: %w", strings.Join(pkgs, " "), err)
	}
	return nil
}
