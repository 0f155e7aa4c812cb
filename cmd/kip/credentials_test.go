package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/credential"
)

// TestCredentialsWiring checks what each kip credentials command hands to internal/credential,
// and the calls refused before anything connects.
func TestCredentialsWiring(t *testing.T) {
	var got any
	runners := credentialRunners{
		list:  func(o *credential.Options) error { got = o; return nil },
		allow: func(o *credential.AllowOptions) error { got = o; return nil },
	}
	run := func(args ...string) error {
		got = nil
		f, _, _ := testFactory(nil)
		f.Args = args
		return executeWith(f, args, func(f *cli.Factory) *cobra.Command { return newCredentialsCmd(f, runners) })
	}
	if err := run("credentials", "list", "-o", "json"); err != nil || !got.(*credential.Options).JSON || got.(*credential.Options).Kube == nil {
		t.Errorf("list -o json: %+v %v", got, err)
	}
	if err := run("credentials", "list"); err != nil || got.(*credential.Options).JSON {
		t.Errorf("list: %+v %v", got, err)
	}
	if err := run("credentials", "allow", "github-deploy", "shop", "blog", "--yes"); err != nil {
		t.Fatal(err)
	}
	if o := got.(*credential.AllowOptions); o.Name != "github-deploy" || !slices.Equal(o.Projects, []string{"shop", "blog"}) || o.Prompter == nil || o.Printer == nil {
		t.Errorf("allow: %+v", o)
	}
	for _, args := range [][]string{{"credentials", "allow", "github-deploy"}, {"credentials", "list", "extra"}, {"credentials", "nope"}} {
		if err := run(args...); cli.ExitCode(err) != cli.ExitUsage || got != nil {
			t.Errorf("kip %s: %v (exit %d), want a usage error before anything runs", strings.Join(args, " "), err, cli.ExitCode(err))
		}
	}
}

// TestCredentialsUsage: kip credentials allow refuses a project name that cannot be on an
// allow-list before it reads the cluster.
func TestCredentialsUsage(t *testing.T) {
	for _, p := range []string{"a,b", "a b"} {
		_, _, err := execute(t, "credentials", "allow", "github-deploy", p)
		if cli.ExitCode(err) != cli.ExitUsage || !strings.Contains(err.Error(), "is not a project name") {
			t.Errorf("kip credentials allow github-deploy %q: %v (exit %d)", p, err, cli.ExitCode(err))
		}
	}
}
