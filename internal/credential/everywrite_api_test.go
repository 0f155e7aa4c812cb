//go:build kipfault

package credential_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/credential"
	"kipper.run/kip/internal/fault"
	"kipper.run/kip/internal/fault/faulttest"
	"kipper.run/kip/internal/workflow"
)

// The helper process's environment: the parent's kubeconfig, and the grants it writes (JSON).
const (
	helperKubeconfig = "KIP_CREDENTIAL_HELPER_KUBECONFIG"
	helperGrants     = "KIP_CREDENTIAL_HELPER_GRANTS"
)

func init() { asHelper = faulttest.AsHelper(helperKubeconfig, helperSeed) }

// helperSeed runs the seed step, as the upgrade runs it, with the grants the parent approved.
func helperSeed(kubeconfig string) error {
	cl, err := faulttest.Clients(kubeconfig)
	if err != nil {
		return err
	}
	var grants []credential.Grant
	if err := json.Unmarshal([]byte(os.Getenv(helperGrants)), &grants); err != nil {
		return err
	}
	ios := &cli.IOStreams{Out: os.Stderr, ErrOut: os.Stderr, Getenv: func(string) string { return "" }}
	p := cli.NewPrinter(ios)
	return (&workflow.Runner{Report: p}).Run(context.Background(), &workflow.Workflow{
		Name: "credential-seed-test", Steps: []workflow.Step{credential.SeedStep(cl, grants, p)}})
}

// TestSeedKilledAfterEveryWrite kills the seed step right after each of its writes in turn
// (one per credential), each run resuming with the same approved grants, and checks the end
// state: every granted credential has the projects of its grant, the one set by someone else
// before the seed keeps its list, the unused one stays unset.
func TestSeedKilledAfterEveryWrite(t *testing.T) {
	env, cl := clients(t)
	sfx := suffix(t)
	name := func(n string) string { return n + "-" + sfx }
	for _, n := range []string{"a", "b", "c", "set", "unused"} {
		addSecret(t, cl, name(n), false, nil)
	}
	grants := []credential.Grant{
		{Credential: name("a"), Projects: []string{"shop"}},
		{Credential: name("b"), Projects: []string{"blog", "shop"}},
		{Credential: name("c"), Projects: []string{"blog"}},
		{Credential: name("set"), Projects: []string{"shop"}},
	}
	setAnnotation(t, cl, name("set"), "other")
	raw, err := json.Marshal(grants)
	if err != nil {
		t.Fatal(err)
	}
	made := filepath.Join(t.TempDir(), "made")
	writes := faulttest.KillEveryWrite(t, "the credential seed", func() (syscall.Signal, string) {
		r := faulttest.Run(t, 2*time.Minute, helperKubeconfig+"="+env.KubeconfigPath, helperGrants+"="+string(raw), fault.KillNewWriteEnv+"="+made)
		if r.Signal == 0 && r.Exit != 0 {
			t.Fatalf("the seed failed:\n%s", r.Stderr)
		}
		return r.Signal, r.Stderr
	}, nil)
	if len(writes) != 3 {
		t.Errorf("killed after %d writes, want one per credential to seed (3):\n%s", len(writes), strings.Join(writes, "\n"))
	}
	for _, w := range writes {
		if !strings.Contains(w, "PATCH /api/v1/namespaces/kipper-system/secrets/") {
			t.Errorf("a write other than a credential's patch: %s", w)
		}
	}
	for n, want := range map[string]string{"a": "shop", "b": "blog,shop", "c": "blog", "set": "other"} {
		if v, ok := annotation(t, cl, name(n)); !ok || v != want {
			t.Errorf("%s: allow-list %q (set %v), want %q", n, v, ok, want)
		}
	}
	if _, ok := annotation(t, cl, name("unused")); ok {
		t.Errorf("the unused credential got an allow-list")
	}
}
