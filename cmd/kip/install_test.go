package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/install"
	"kipper.run/kip/internal/sshx"
)

// runInstallCmd runs kip install with args, handing what the command builds to runF.
func runInstallCmd(t *testing.T, env map[string]string, args []string, runF func(install.Env, *install.Options) error) error {
	t.Helper()
	f, _, _ := testFactory(env)
	f.Args = append([]string{"install"}, args...)
	return executeWith(f, f.Args, func(f *cli.Factory) *cobra.Command { return newInstallCmd(f, runF) })
}

// TestInstallWiring checks what kip install hands to internal/install: the options from its
// flags, and from the factory the cluster's name, the SSH settings saved with it, the store and
// the whole command line.
func TestInstallWiring(t *testing.T) {
	home := t.TempDir()
	t.Setenv("KIP_HOME", home)
	keyFile := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(keyFile, []byte("s3cr3t\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--host", "203.0.113.10", "--ssh-user", "admin", "--ssh-key", "./id", "--ssh-port", "2222",
		"--backup-storage-bucket", "b", "--backup-storage-access-key-id", "id", "--backup-storage-secret-access-key-file", keyFile}
	var env install.Env
	var o *install.Options
	err := runInstallCmd(t, map[string]string{"KIP_CLUSTER": "prod"}, args, func(e install.Env, opts *install.Options) error {
		env, o = e, opts
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if o.Host != "203.0.113.10" || o.SSHPort != 2222 || !o.SSHPortSet || o.Backups == nil || o.Backups.SecretAccessKey != "s3cr3t" || !o.Firewall {
		t.Errorf("options %+v", o)
	}
	if env.Cluster != "prod" || env.SSHUser != "admin" || !env.SSHUserSet || env.SSHKey != "./id" || env.Store.Dir != home ||
		env.Printer == nil || env.Prompter == nil || env.SSHConfig == nil || env.Dial == nil || env.Debugf == nil ||
		!strings.HasPrefix(env.CommandLine, "kip install --host 203.0.113.10 --ssh-user admin") {
		t.Errorf("env %+v", env)
	}
}

// TestInstallRefusesOffATerminal: without --yes and without a terminal to ask on, kip install
// refuses with a usage error before it connects anywhere.
func TestInstallRefusesOffATerminal(t *testing.T) {
	t.Setenv("KIP_HOME", t.TempDir())
	err := runInstallCmd(t, nil, []string{"--host", "203.0.113.10"}, func(env install.Env, o *install.Options) error {
		env.Dial = func(context.Context, sshx.Config) (*sshx.Client, error) {
			t.Fatal("install dialled the host")
			return nil, nil
		}
		return install.Run(context.Background(), env, *o)
	})
	if cli.ExitCode(err) != cli.ExitUsage || err == nil || !strings.Contains(err.Error(), "--yes is required when not running interactively") {
		t.Fatalf("install off a terminal without --yes: exit %d, %v", cli.ExitCode(err), err)
	}
	// --ssh-port 0 is a usage error too, before anything is dialled.
	err = runInstallCmd(t, nil, []string{"--host", "203.0.113.10", "--dry-run", "--ssh-port", "0"}, func(env install.Env, o *install.Options) error {
		return install.Run(context.Background(), env, *o)
	})
	if cli.ExitCode(err) != cli.ExitUsage || !strings.Contains(err.Error(), "--ssh-port 0") {
		t.Errorf("--ssh-port 0: exit %d, %v", cli.ExitCode(err), err)
	}
}
