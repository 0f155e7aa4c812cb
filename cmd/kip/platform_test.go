package main

import (
	"testing"

	"kipper.run/kip/internal/buildinfo"
	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/platform"
)

// TestPlatformWiring checks what kip platform enable, disable and profile hand to
// internal/platform: the component, on or off, the profile, and what every one needs.
func TestPlatformWiring(t *testing.T) {
	type got struct {
		mon     *platform.MonitoringOptions
		show    *platform.Options
		profile *platform.ProfileOptions
	}
	run := func(t *testing.T, args ...string) (got, error) {
		t.Helper()
		f, _, _ := testFactory(nil)
		f.Args = append([]string{"platform"}, args...)
		var g got
		root := newRootCmd(f)
		for _, c := range root.Commands() {
			if c.Name() != "platform" {
				continue
			}
			for _, sub := range c.Commands() {
				if sub.Name() != "versions" {
					c.RemoveCommand(sub)
				}
			}
			record := func(o *platform.MonitoringOptions) error { g.mon = o; return nil }
			c.AddCommand(newPlatformSwitchCmd(f, true, record), newPlatformSwitchCmd(f, false, record),
				newPlatformProfileCmd(f, func(o *platform.Options) error { g.show = o; return nil },
					func(o *platform.ProfileOptions) error { g.profile = o; return nil }))
		}
		root.SetArgs(append([]string{"platform"}, args...))
		return g, root.Execute()
	}
	common := func(t *testing.T, o platform.Options, holder string) {
		t.Helper()
		if o.Kube == nil || o.Printer == nil || o.Prompter == nil || o.KipVersion != buildinfo.Version || o.Holder != holder {
			t.Errorf("options %+v", o)
		}
	}

	g, err := run(t, "enable", "loki")
	if err != nil || g.mon == nil || g.mon.Component != platform.PlatformLoki || !g.mon.On {
		t.Fatalf("enable loki: %+v %v", g.mon, err)
	}
	common(t, g.mon.Options, "kip platform enable loki")
	if g, err = run(t, "disable", "prometheus"); err != nil || g.mon == nil || g.mon.Component != platform.PlatformPrometheus || g.mon.On {
		t.Fatalf("disable prometheus: %+v %v", g.mon, err)
	}
	if g, err = run(t, "profile", "set", "small"); err != nil || g.profile == nil || g.profile.Profile != "small" {
		t.Fatalf("profile set small: %+v %v", g.profile, err)
	}
	common(t, g.profile.Options, "kip platform profile set small")
	if g, err = run(t, "profile", "show", "-o", "json"); err != nil || g.show == nil || !g.show.JSON {
		t.Fatalf("profile show -o json: %+v %v", g.show, err)
	}
	for _, args := range [][]string{{"enable", "grafana"}, {"enable"}, {"profile", "set"}} {
		if _, err := run(t, args...); cli.ExitCode(err) != cli.ExitUsage {
			t.Errorf("platform %v: exit %d (%v), want usage", args, cli.ExitCode(err), err)
		}
	}
}
