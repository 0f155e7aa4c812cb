package main

import (
	"os"
	"strings"

	"github.com/spf13/cobra"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/install"
)

// installFlags are kip install's flags, before the backup storage flags are folded into
// install.Options.
type installFlags struct {
	opts          install.Options
	bucket        string
	endpoint      string
	region        string
	accessKeyID   string
	secretKeyFile string
}

func newInstallCmd(f *cli.Factory, runF func(install.Env, *install.Options) error) *cobra.Command {
	fl := &installFlags{}
	cmd := &cobra.Command{
		Use:   "install --host HOST",
		Short: "Install a Kipper cluster on a server, or re-run the install on one",
		Long: `Install turns a bare Linux server into a Kipper cluster over SSH: it checks the host,
picks the sizing profile and storage, prepares the host, installs k3s (verified against the
release's checksums) and the Kipper components, then verifies every node.

A server with less than 6000 MiB of RAM, or too few CPUs for a larger profile, gets the nano
profile with local storage; --storage longhorn starts on Longhorn instead (6000 MiB or more).
Killed at any step, the same command continues. Re-running it on an installed cluster keeps
its storage mode and profile, moves k3s at most one minor version and restarts k3s on the
configuration kip writes; users created in the console are kept.`,
		Example: `  kip install --host 203.0.113.10 --admin-email admin@example.com
  kip install --host 203.0.113.10 --storage longhorn --backup-storage-bucket backups \
      --backup-storage-endpoint https://s3.example.com --backup-storage-access-key-id AKIA... \
      --backup-storage-secret-access-key-file ./secret-key
  kip install --host 203.0.113.10 --airgap-bundle ./k3s-v1.37.2+k3s1 --yes
  kip install --host 203.0.113.10 --dry-run`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			fl.opts.SSHPortSet = cmd.Flags().Changed("ssh-port")
			if err := fl.backups(f); err != nil {
				return err
			}
			env, err := installEnv(f)
			if err != nil {
				return err
			}
			if runF != nil {
				return runF(env, &fl.opts)
			}
			return install.Run(cmd.Context(), env, fl.opts)
		},
	}
	o := &fl.opts
	fs := cmd.Flags()
	fs.StringVar(&o.Host, "host", "", "the server's address or name (required)")
	fs.StringVar(&o.AdminEmail, "admin-email", "", "email of the console's first admin")
	fs.StringVar(&o.Profile, "profile", "", "sizing profile: nano, small, standard or large (default: the largest the server fits)")
	fs.StringVar(&o.Storage, "storage", "", "storage: local or longhorn (default: local on nano, longhorn otherwise)")
	fs.StringVar(&fl.bucket, "backup-storage-bucket", "", "S3 bucket for backups outside the cluster")
	fs.StringVar(&fl.endpoint, "backup-storage-endpoint", "", "S3 endpoint URL of the backup bucket (default: AWS)")
	fs.StringVar(&fl.region, "backup-storage-region", "", "region of the backup bucket")
	fs.StringVar(&fl.accessKeyID, "backup-storage-access-key-id", "", "access key ID for the backup bucket")
	fs.StringVar(&fl.secretKeyFile, "backup-storage-secret-access-key-file", "", "file holding the bucket's secret access key (or set KIP_BACKUP_SECRET_ACCESS_KEY)")
	fs.StringVar(&o.AirgapBundle, "airgap-bundle", "", "directory with the k3s release's binary and sha256sum file, uploaded instead of downloaded")
	fs.IntVar(&o.SSHPort, "ssh-port", 0, "SSH port of the server (default: saved, ~/.ssh/config, or 22)")
	fs.BoolVar(&o.Firewall, "firewall", true, "manage the host firewall (ufw or firewalld); an active firewall kip does not manage is left alone")
	fs.BoolVar(&o.DryRun, "dry-run", false, "print the plan for this host and change nothing")
	return cmd
}

// backups folds the backup storage flags into the options. The secret key is read from a file
// or the environment, never from the command line, where other users could read it.
func (fl *installFlags) backups(f *cli.Factory) error {
	if fl.bucket == "" && fl.endpoint == "" && fl.region == "" && fl.accessKeyID == "" && fl.secretKeyFile == "" {
		return nil
	}
	b := &components.BackupStorage{Bucket: fl.bucket, Endpoint: fl.endpoint, Region: fl.region, AccessKeyID: fl.accessKeyID}
	switch {
	case fl.secretKeyFile != "":
		data, err := os.ReadFile(fl.secretKeyFile)
		if err != nil {
			return cli.Usagef("--backup-storage-secret-access-key-file: %v", err)
		}
		b.SecretAccessKey = strings.TrimSpace(string(data))
	default:
		b.SecretAccessKey = f.IO.Getenv("KIP_BACKUP_SECRET_ACCESS_KEY")
	}
	fl.opts.Backups = b
	return nil
}

// installEnv is what kip install takes from the factory.
func installEnv(f *cli.Factory) (install.Env, error) {
	store, err := f.ConfigStore()
	if err != nil {
		return install.Env{}, err
	}
	return install.Env{
		Printer: f.Printer(), Prompter: f.Prompter(), Store: store, Cluster: f.ClusterName(),
		SSHUser: f.Global.SSHUser, SSHUserSet: f.Global.SSHUserSet, SSHKey: f.Global.SSHKey,
		SSHConfig: f.SSHConfig, Dial: f.SSH, CommandLine: f.CommandLine(), Debugf: f.Debugf,
	}, nil
}
