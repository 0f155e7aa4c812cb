package main

import (
	"strings"
	"testing"

	"kipper.run/kip/internal/cli"
)

// TestAppUsage: the kip app commands refuse a call that cannot work before they read the
// cluster, as usage errors.
func TestAppUsage(t *testing.T) {
	app := []string{"app"}
	named := []string{"web", "--project", "shop", "--environment", "prod"}
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{append(append(app, "autoscale"), named...), "nothing to set: give the bounds and a target (--min N --max M --cpu-target P), or --off"},
		{append(append(app, "autoscale"), append(named, "--off", "--cpu-target", "50")...), "--off with a target"},
		{append(append(app, "scale"), append(named, "--replicas", "-2")...), "--replicas -2 is not a count of pods"},
		{append(append(app, "autoscale"), append(named, "--min", "x")...), `invalid argument "x" for "--min"`},
		{append(append(app, "stop"), "web", "extra", "--project", "shop", "--environment", "prod"), "accepts 1 arg"},
	} {
		_, _, err := execute(t, tc.args...)
		if cli.ExitCode(err) != cli.ExitUsage || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("kip %s: exit %d, %v; want a usage error with %q", strings.Join(tc.args, " "), cli.ExitCode(err), err, tc.msg)
		}
	}
	// A missing --replicas or --project is refused by its flag's requirement.
	for _, args := range [][]string{{"app", "scale", "web", "--project", "shop", "--environment", "prod"}, {"app", "info", "web", "--environment", "prod"}} {
		if _, _, err := execute(t, args...); err == nil || !strings.Contains(err.Error(), "required flag") {
			t.Errorf("kip %s: %v, want a required flag refused", strings.Join(args, " "), err)
		}
	}
}
