package main

import (
	"github.com/spf13/cobra"

	"kipper.run/kip/internal/buildinfo"
	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/upgrade"
)

func newUpgradeCmd(f *cli.Factory, runF func(*upgrade.Options) error) *cobra.Command {
	opts := &upgrade.Options{}
	cmd := &cobra.Command{
		Use:   "upgrade",
		Short: "Upgrade the cluster to this kip's Kipper CRDs, console and system components",
		Long: `Upgrade the cluster to what this kip pins, in order: (1) the Kipper CRDs, (2) console-api
(with this kip's pod hardening) and the console restarted onto their images, each waited for
until its new pods run alone, (3) the system components (Traefik, Longhorn at the release the
cluster runs, KEDA, Velero, Zot, monitoring when enabled) re-applied at their pins, after a
prompt. cert-manager's version, Dex and the initial admin binding are not touched.

It first checks the cluster's data against this kip's rules: the Kipper schemas' guards and
every app's autoscaling settings. Fixes are written only on consent ("Apply these fixes?", or
--repair-autoscaling), late, once the new console-api serves alone; an app that needs a decision
stops the upgrade unless --skip-autoscaling-check. --check reports all this and changes
nothing; it exits 3 when something needs a decision or the upgrade would refuse. A stopped or
failed upgrade resumes where it was when run again. See docs/upgrade.md.

Every upgrade but --check reaches the server over SSH, even with --skip-system: it gives the API
server the arguments this kip installs (audit logging, and operators' login through the
cluster's Dex when Dex answers) with their files, and restarts k3s once when one of them changes
(the API pauses, pods keep serving); k3s that does not come back on a changed config.yaml gets
the previous one back. A kube-apiserver-arg block of your own that lacks some is left to you:
the upgrade prints the lines to add and stops.

With --k3s it first moves k3s to the release this kip pins, over SSH: the server (the API
pauses while k3s restarts, usually under a minute; pods keep serving), then each ready worker
in name order, without a drain. It refuses before changing anything when the server is more
than one Kubernetes minor behind, a node runs a newer release, a worker is still joining, or the
move would leave a worker more than three minors behind. --check --k3s reports the plan.`,
		Example: `  kip upgrade --check
  kip upgrade
  kip upgrade --skip-system
  kip upgrade --check --k3s
  kip upgrade --k3s --yes
  kip upgrade --yes --repair-autoscaling`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Kube, opts.Printer, opts.Prompter, opts.Out = f.Kube, f.Printer(), f.Prompter(), f.IO.Out
			opts.Holder, opts.KipVersion, opts.Debugf = f.CommandLine(), buildinfo.Version, f.Debugf
			if !opts.Check { // every upgrade reaches the server over SSH: its k3s configuration
				var err error
				if opts.Server, opts.Dial, err = hostDialer(f); err != nil {
					return err
				}
				if opts.Saved, err = savedCluster(f); err != nil {
					return err
				}
			}
			if runF != nil {
				return runF(opts)
			}
			return upgrade.Run(cmd.Context(), opts)
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&opts.Check, "check", false, "report what the upgrade would fix and change nothing; exits 3 when something needs a decision")
	fl.BoolVar(&opts.SkipSystem, "skip-system", false, "skip the system components: only the Kipper CRDs and the console layer")
	fl.BoolVar(&opts.RepairAutoscaling, "repair-autoscaling", false, "apply the autoscaling fixes the upgrade lists without asking (needed off a terminal when there are fixes)")
	fl.BoolVar(&opts.SkipAutoscalingCheck, "skip-autoscaling-check", false, "upgrade although some apps need a decision, leaving those apps as they are")
	fl.StringVar(&opts.ImageTag, "image-tag", "", "run a commit's console images, by its full 40-character SHA (needs --skip-system)")
	fl.BoolVar(&opts.K3s, "k3s", false, "also move k3s to the release this kip pins, first: the server, then each ready worker (with --check, report the plan)")
	fl.StringVar(&opts.AirgapBundle, "airgap-bundle", "", "with --k3s, a directory with the k3s release's binary and its sha256sum file, uploaded to each host instead of downloaded there")
	fl.BoolVar(&opts.SeedCredentialGrants, "seed-credential-grants", false, "grant each shared git credential whose allow-list was never set the projects whose apps use it, without asking")
	return cmd
}
