package main

import (
	"encoding/json"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/config"
	"kipper.run/kip/internal/status"
	"kipper.run/kip/test/tcpcount"
	"kipper.run/kip/test/testenv"
)

// TestStatusDoctorWiring checks what the commands hand to internal/status: output, SSH from the
// saved cluster unless --api-only or --kubeconfig alone chose another cluster.
func TestStatusDoctorWiring(t *testing.T) {
	home := t.TempDir()
	t.Setenv("KIP_HOME", home)
	if err := (config.Store{Dir: home}).Update(func(c *config.Config) error {
		c.Put(config.Cluster{Name: "lab", Host: "203.0.113.10", Kubeconfig: filepath.Join(home, "kc")})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args       []string
		wantJSON   bool
		wantAPI    bool
		wantServer string
		wantDial   bool
	}{
		{nil, false, false, "203.0.113.10", true},
		{[]string{"-o", "json"}, true, false, "203.0.113.10", true},
		{[]string{"--api-only"}, false, true, "", false},
		{[]string{"--kubeconfig", filepath.Join(home, "other")}, false, false, "", true},
		{[]string{"--kubeconfig", filepath.Join(home, "other"), "--cluster", "lab"}, false, false, "203.0.113.10", true},
	}
	for _, name := range []string{"status", "doctor"} {
		for _, tt := range tests {
			f, _, _ := testFactory(nil)
			var got *status.Options
			runF := func(o *status.Options) error { got = o; return nil }
			build := func(f *cli.Factory) *cobra.Command { return newStatusCmd(f, runF) }
			if name == "doctor" {
				build = func(f *cli.Factory) *cobra.Command { return newDoctorCmd(f, runF) }
			}
			if err := executeWith(f, append([]string{name}, tt.args...), build); err != nil {
				t.Fatalf("%s %v: %v", name, tt.args, err)
			}
			if got.JSON != tt.wantJSON || got.APIOnly != tt.wantAPI || got.Server != tt.wantServer || (got.Dial != nil) != tt.wantDial || got.Out == nil || got.Kube == nil {
				t.Errorf("%s %v: options %+v", name, tt.args, got)
			}
		}
	}
}

// TestStatusDoctorNeverConnectOnUsage runs help and flag errors of both commands with a saved
// cluster whose SSH and API addresses count connections.
func TestStatusDoctorNeverConnectOnUsage(t *testing.T) {
	addr, accepted := tcpcount.Listen(t)
	home := t.TempDir()
	t.Setenv("KIP_HOME", home)
	host, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	if err := (config.Store{Dir: home}).Update(func(c *config.Config) error {
		c.Put(config.Cluster{Name: "lab", Host: host, SSHPort: p, Kubeconfig: filepath.Join(home, "kc")})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"status", "--help"}, {"doctor", "--help"}, {"status", "--bogus"}, {"doctor", "extra"}, {"-o", "xml", "doctor"}} {
		_, _, err := execute(t, args...)
		if args[len(args)-1] != "--help" && cli.ExitCode(err) != cli.ExitUsage {
			t.Errorf("%v: exit code %d (%v), want %d", args, cli.ExitCode(err), err, cli.ExitUsage)
		}
	}
	if n := accepted.Load(); n != 0 {
		t.Fatalf("%d connections were made", n)
	}
}

// TestDoctorFailureExitsOne checks that failed checks exit 1, with a message that only counts
// them: the report already named each.
func TestDoctorFailureExitsOne(t *testing.T) {
	err := &status.FailedError{Failed: 2, Total: 14}
	if cli.ExitCode(err) != cli.ExitFailed || err.Error() != "2 of 14 checks failed" {
		t.Fatalf("exit %d, message %q", cli.ExitCode(err), err)
	}
}

// TestStatusDoctorCommands runs both commands end to end against a real API server with no
// nodes and no cluster record: status reports what it found, doctor fails on the missing nodes
// with exit code 1 and an error that only counts the failures.
func TestStatusDoctorCommands(t *testing.T) {
	env := testenv.Start(t)
	t.Setenv("KIP_HOME", t.TempDir())

	out, _, err := execute(t, "--kubeconfig", env.KubeconfigPath, "status", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var r status.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if r.Cluster.Recorded || len(r.Nodes) != 0 || !slices.ContainsFunc(r.Skipped, func(s string) bool { return strings.Contains(s, "no kip cluster record") }) {
		t.Errorf("status %+v", r)
	}

	out, _, err = execute(t, "--kubeconfig", env.KubeconfigPath, "doctor", "--api-only")
	if cli.ExitCode(err) != cli.ExitFailed || !strings.HasSuffix(err.Error(), "checks failed") {
		t.Fatalf("doctor: exit %d, %v\n%s", cli.ExitCode(err), err, out)
	}
	for _, want := range []string{"✔ api: ", "✗ nodes: the cluster has no nodes", "! cluster record: no kip cluster record", "- host checks: skipped with --api-only"} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, out)
		}
	}
}

// TestStatusDoctorNoCluster runs both commands on a machine where kip installed nothing and no
// kubeconfig exists: they say that no cluster is saved and how to install one.
func TestStatusDoctorNoCluster(t *testing.T) {
	kipHome, home := t.TempDir(), t.TempDir()
	t.Setenv("KIP_HOME", kipHome)
	t.Setenv("HOME", home)
	t.Setenv("KUBECONFIG", "")
	want := "no cluster is saved in " + filepath.Join(kipHome, "config.yaml") + " and no kubeconfig was found (looked in " +
		filepath.Join(home, ".kube", "config") + "): install one with 'kip install --host <server address>', or pass --kubeconfig"

	_, _, err := execute(t, "status")
	if cli.ExitCode(err) != cli.ExitFailed || err.Error() != want {
		t.Errorf("status: exit %d, error %v\nwant %s", cli.ExitCode(err), err, want)
	}
	out, _, err := execute(t, "doctor")
	if cli.ExitCode(err) != cli.ExitFailed || !strings.Contains(out, "✗ api: "+want+"\n") ||
		!strings.Contains(out, "    fix: install a cluster with 'kip install --host <server address>'") {
		t.Errorf("doctor: exit %d (%v)\n%s\nwant the api check to say %s", cli.ExitCode(err), err, out, want)
	}
}
