package main

import (
	"github.com/spf13/cobra"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/credential"
)

// credentialRunners replace what kip credentials' subcommands run, for tests; nil fields run the
// real thing.
type credentialRunners struct {
	list  func(*credential.Options) error
	allow func(*credential.AllowOptions) error
}

func newCredentialsCmd(f *cli.Factory, run credentialRunners) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "credentials",
		Short: "List the shared git credentials and the projects allowed to use each",
		Long: `The shared git credentials are the git logins console-api keeps for the cluster (Secrets in
kipper-system labelled kipper.run/git-credential=true), which a project's apps name to clone
their repository. Each has an allow-list of projects: only their apps may use it. A credential
from before allow-lists has none, and every project's apps may use it, until kip upgrade seeds
it with the projects whose apps use it (on consent) or 'kip credentials allow' sets it.

kip reads and writes only the credentials' metadata, never their data. See docs/credentials.md.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newCredentialsListCmd(f, run.list), newCredentialsAllowCmd(f, run.allow))
	return cmd
}

func credentialOptions(f *cli.Factory) credential.Options {
	return credential.Options{Kube: f.Kube, Printer: f.Printer(), Prompter: f.Prompter(),
		JSON: f.Global.Output == cli.OutputJSON, Out: f.IO.Out}
}

func newCredentialsListCmd(f *cli.Factory, runF func(*credential.Options) error) *cobra.Command {
	o := &credential.Options{}
	return &cobra.Command{
		Use:   "list",
		Short: "List the shared git credentials with their allow-lists and the projects whose apps use them",
		Long: `List each shared git credential with the projects its allow-list allows ("every project
(never set)" for a credential from before allow-lists) and the projects whose apps use it
(spec.git.credential), marking those the list leaves out: console-api refuses their apps the
credential.`,
		Example: "  kip credentials list\n  kip credentials list -o json",
		Args:    usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			*o = credentialOptions(f)
			if runF != nil {
				return runF(o)
			}
			return credential.ShowList(cmd.Context(), o)
		},
	}
}

func newCredentialsAllowCmd(f *cli.Factory, runF func(*credential.AllowOptions) error) *cobra.Command {
	o := &credential.AllowOptions{}
	return &cobra.Command{
		Use:   "allow NAME PROJECT...",
		Short: "Let projects' apps use a shared git credential (add them to its allow-list)",
		Long: `Add projects to the allow-list of a shared git credential. The credential and every project
must exist ('kip credentials list' lists the credentials).

A credential from before allow-lists has none, and every project's apps may use it: allowing
projects turns its list on, so every other project's apps lose it. kip says which projects'
apps use it and would lose it, and asks first (--yes answers; without a terminal --yes is
required). Adding a project to a list already on asks nothing.`,
		Example: "  kip credentials allow github-deploy shop\n  kip credentials allow github-deploy shop blog --yes",
		Args:    usageArgs(cobra.MinimumNArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Options, o.Name, o.Projects = credentialOptions(f), args[0], args[1:]
			if runF != nil {
				return runF(o)
			}
			return credential.Allow(cmd.Context(), o)
		},
	}
}
