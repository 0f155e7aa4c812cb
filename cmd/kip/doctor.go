package main

import (
	"github.com/spf13/cobra"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/status"
)

func newDoctorCmd(f *cli.Factory, runF func(*status.Options) error) *cobra.Command {
	opts := &status.Options{}
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check the cluster and its hosts, and say how to fix what is wrong",
		Long: `Run checks, each reported as passed (✔), a warning (!), failed (✗) or skipped (-), with the
command that fixes it:

  through the API: the API answers with the saved credentials, every node is Ready, each node's
  k3s is the release this kip pins, the storage installed is the mode kip recorded, Longhorn
  disks have room, this kip is not older than the one that installed the cluster, no kip
  operation is left unfinished, and the API server's clock agrees with this machine's;

  over SSH on the server and every node: the k3s service (systemd's state and, when it does not
  run, its last journal lines), certificate expiry (server and agent certificates), the host's
  clock, free disk, the host firewall and who manages it, the wireguard module, and on Longhorn
  clusters the OS and kernel rule (no Rocky Linux or AlmaLinux 9.7+, no EL9 kernel from
  5.14.0-611). A host whose SSH host key changed fails, with how to verify and accept the new key.

Without SSH (--api-only, or no key that logs in) the host checks are reported as skipped, with
how to run them. kip doctor exits 1 when a check failed, 0 otherwise. See docs/status.md.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := wireStatus(f, opts); err != nil {
				return err
			}
			if runF != nil {
				return runF(opts)
			}
			return status.Doctor(cmd.Context(), opts)
		},
	}
	cmd.Flags().BoolVar(&opts.APIOnly, "api-only", false, "run only the checks through the Kubernetes API: connect to no host over SSH")
	return cmd
}
