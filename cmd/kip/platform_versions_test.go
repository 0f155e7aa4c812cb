package main

import (
	"encoding/json"
	"strings"
	"testing"

	"kipper.run/kip/internal/buildinfo"
	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/platform"
	"kipper.run/kip/test/testenv"
)

// TestPlatformVersionsWiring checks what kip platform versions hands to internal/platform.
func TestPlatformVersionsWiring(t *testing.T) {
	for _, tt := range []struct {
		args     []string
		wantJSON bool
	}{{nil, false}, {[]string{"-o", "json"}, true}} {
		f, out, _ := testFactory(nil)
		var got *platform.VersionsOptions
		root := newRootCmd(f)
		for _, c := range root.Commands() {
			if c.Name() != "platform" {
				continue
			}
			for _, sub := range c.Commands() {
				if sub.Name() == "versions" {
					c.RemoveCommand(sub)
				}
			}
			c.AddCommand(newPlatformVersionsCmd(f, func(o *platform.VersionsOptions) error { got = o; return nil }))
		}
		root.SetArgs(append([]string{"platform", "versions"}, tt.args...))
		if err := root.Execute(); err != nil {
			t.Fatalf("%v: %v", tt.args, err)
		}
		if got == nil || got.JSON != tt.wantJSON || got.Out != out || got.Kube == nil || got.KipVersion != buildinfo.Version {
			t.Errorf("%v: options %+v", tt.args, got)
		}
	}
	if _, _, err := execute(t, "platform", "versions", "extra"); cli.ExitCode(err) != cli.ExitUsage {
		t.Errorf("platform versions extra: exit %d (%v), want %d", cli.ExitCode(err), err, cli.ExitUsage)
	}
}

// TestPlatformVersionsCommand runs the command against a real API server where kip installed
// nothing: Kipper's CRDs without kip's stamp, no nodes, no charts.
func TestPlatformVersionsCommand(t *testing.T) {
	env := testenv.Start(t)
	t.Setenv("KIP_HOME", t.TempDir())

	out, _, err := execute(t, "--kubeconfig", env.KubeconfigPath, "platform", "versions", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var r platform.VersionsReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if r.Kip.Recorded != "" || r.Kip.Running != buildinfo.Version || r.ConsoleAPI.Recorded || len(r.Nodes) != 0 || len(r.Charts) == 0 {
		t.Errorf("report %+v", r)
	}
	for _, ch := range r.Charts {
		if ch.State != platform.ChartNotInstalled {
			t.Errorf("chart %+v on an empty cluster", ch)
		}
	}

	out, _, err = execute(t, "--kubeconfig", env.KubeconfigPath, "platform", "versions")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kip: none recorded on the App CRD, this kip " + buildinfo.Version + "\n",
		"console-api: " + platform.ConsoleAPIUnknown + "\n", "- traefik ", "not installed"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
