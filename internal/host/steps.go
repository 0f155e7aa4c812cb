package host

import (
	"context"
	"fmt"
	"strings"

	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/workflow"
)

// Prep is what a host is prepared for, as kip install prepares the server and kip node add a
// worker.
type Prep struct {
	OS        sshx.OS
	Longhorn  bool // Longhorn's packages and modules
	WireGuard bool // the wireguard module
	// Sysctls sets kip's kernel parameters: on a fresh host only, since an operator may have
	// tuned them since.
	Sysctls bool
	// Firewall, when not nil, are the rules of the kip-managed firewall.
	Firewall []Rule
}

// PrepSteps are the steps that prepare the host c: Longhorn's packages, kernel modules, kernel
// parameters, the firewall and service hardening.
func (f Family) PrepSteps(c *sshx.Client, p Prep) []workflow.Step {
	var steps []workflow.Step
	if p.Longhorn {
		pkgs := f.LonghornPackages
		steps = append(steps, workflow.Step{
			Name: "host-packages", Title: "Install Longhorn's host packages (" + strings.Join(pkgs, ", ") + ")",
			Done: "Installed Longhorn's host packages", Already: "Longhorn's host packages already installed",
			Check: func(ctx context.Context) (bool, error) {
				missing, err := f.MissingPackages(ctx, c, pkgs)
				return len(missing) == 0, err
			},
			Plan: func(ctx context.Context) ([]string, error) {
				missing, err := f.MissingPackages(ctx, c, pkgs)
				return []string{"install " + strings.Join(missing, ", ") + " with " + f.Packages}, err
			},
			Apply: func(ctx context.Context) error { return f.InstallPackages(ctx, c, pkgs) },
		})
	}
	mods := Modules(p.Longhorn, p.WireGuard)
	steps = append(steps, workflow.Step{
		Name: "host-modules", Title: "Load kernel modules (" + strings.Join(mods, ", ") + ")",
		Done: "Loaded kernel modules", Already: "Kernel modules already set up",
		Check: func(ctx context.Context) (bool, error) { return ModulesInPlace(ctx, c, mods) },
		Apply: func(ctx context.Context) error { return LoadModules(ctx, c, p.OS, mods) },
	})
	if p.Sysctls {
		steps = append(steps, workflow.Step{
			Name: "host-sysctls", Title: "Set kernel parameters",
			Done: "Set kernel parameters", Already: "Kernel parameters already set",
			Check: func(ctx context.Context) (bool, error) { return SysctlsInPlace(ctx, c) },
			Apply: func(ctx context.Context) error { return ApplySysctls(ctx, c) },
		})
	}
	if p.Firewall != nil {
		steps = append(steps, f.FirewallStep("host-firewall", "", c, p.Firewall))
	}
	return append(steps, workflow.Step{
		Name: "host-hardening", Title: "Apply service hardening",
		Done: "Applied service hardening", Already: "Service hardening already applied",
		Check: func(ctx context.Context) (bool, error) { return HardeningInPlace(ctx, c, p.Longhorn) },
		Apply: func(ctx context.Context) error { return ApplyHardening(ctx, c, p.Longhorn) },
	})
}

// FirewallStep makes the firewall of the host c kip-managed with exactly rules; on names the
// host in its messages ("" for the host being prepared).
func (f Family) FirewallStep(name, on string, c *sshx.Client, rules []Rule) workflow.Step {
	where := ""
	if on != "" {
		where = " on " + on
	}
	return workflow.Step{
		Name: name, Title: "Set up the host firewall" + where + " (" + f.Firewall + ", managed by kip)",
		Done: "Host firewall set up" + where, Already: "Host firewall already set up" + where,
		Check: func(ctx context.Context) (bool, error) { return f.FirewallInPlace(ctx, c, rules) },
		Plan: func(context.Context) ([]string, error) {
			var s []string
			for _, r := range rules {
				s = append(s, fmt.Sprintf("allow %s (%s)", r, r.Why))
			}
			return append(s, "deny other inbound traffic"), nil
		},
		Apply: func(ctx context.Context) error { return f.ApplyFirewall(ctx, c, rules) },
	}
}
