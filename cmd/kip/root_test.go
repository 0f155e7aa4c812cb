package main

import (
	"bytes"
	"errors"
	"flag"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/config"
	"kipper.run/kip/test/tcpcount"
)

var update = flag.Bool("update", false, "rewrite docs/cli from the commands")

// executeWith runs kip's root command of f with args, the command build makes (wired to a test's
// runners) in place of kip's own of that name.
func executeWith(f *cli.Factory, args []string, build func(*cli.Factory) *cobra.Command) error {
	root := newRootCmd(f)
	cmd := build(f)
	for _, c := range root.Commands() {
		if c.Name() == cmd.Name() {
			root.RemoveCommand(c)
		}
	}
	root.AddCommand(cmd)
	root.SetArgs(args)
	return root.Execute()
}

// testFactory returns a factory on buffers, as if not on a terminal.
func testFactory(env map[string]string) (*cli.Factory, *bytes.Buffer, *bytes.Buffer) {
	var out, errOut bytes.Buffer
	io := &cli.IOStreams{
		In: strings.NewReader(""), Out: &out, ErrOut: &errOut,
		Getenv: func(k string) string { return env[k] },
	}
	return cli.NewFactory(io), &out, &errOut
}

func execute(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	f, out, errOut := testFactory(nil)
	root := newRootCmd(f)
	root.SetArgs(args)
	root.SetOut(out)
	root.SetErr(errOut)
	err := root.Execute()
	return out.String(), errOut.String(), err
}

func TestExitCodes(t *testing.T) {
	tests := []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"version"}, cli.ExitOK, ""},
		{[]string{"--bogus"}, cli.ExitUsage, "unknown flag"},
		{[]string{"nope"}, cli.ExitUsage, `unknown command "nope"`},
		{[]string{"-o", "yaml", "version"}, cli.ExitUsage, `invalid --output "yaml"`},
		{[]string{"version", "extra"}, cli.ExitUsage, "unknown command"},
		{[]string{"completion"}, cli.ExitUsage, "bash, zsh or fish"},
		{[]string{"completion", "tcsh"}, cli.ExitUsage, "unsupported shell"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, _, err := execute(t, tt.args...)
			if got := cli.ExitCode(err); got != tt.code {
				t.Fatalf("exit code %d (err %v), want %d", got, err, tt.code)
			}
			if tt.msg != "" && (err == nil || !strings.Contains(err.Error(), tt.msg)) {
				t.Fatalf("error %v, want it to contain %q", err, tt.msg)
			}
		})
	}
}

func TestVersionText(t *testing.T) {
	out, _, err := execute(t, "version")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kip dev (commit unknown)", "k3s", "longhorn", "velero", "kubernetes"} {
		if !strings.Contains(out, want) {
			t.Errorf("version output lacks %q:\n%s", want, out)
		}
	}
}

func TestVersionJSON(t *testing.T) {
	f, _, _ := testFactory(nil)
	var got *VersionOutput
	cmd := newVersionCmd(f, func(v *VersionOutput) error { got = v; return nil })
	cmd.SetArgs(nil)
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if got.Kip.Version == "" || len(got.Components) < 3 {
		t.Fatalf("version output %+v lacks kip's version or components", got)
	}
	out, _, err := execute(t, "version", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"kip": {`, `"version": "dev"`, `"commit": "unknown"`, `"name": "k3s"`} {
		if !strings.Contains(out, want) {
			t.Errorf("json lacks %q:\n%s", want, out)
		}
	}
}

func TestCompletionScripts(t *testing.T) {
	for shell, marker := range map[string]string{"bash": "__start_kip", "zsh": "#compdef kip", "fish": "complete -c kip"} {
		out, _, err := execute(t, "completion", shell)
		if err != nil {
			t.Fatalf("%s: %v", shell, err)
		}
		if !strings.Contains(out, marker) {
			t.Errorf("%s completion lacks %q", shell, marker)
		}
	}
}

// TestCLIReference fails when docs/cli no longer matches the commands; make docs rewrites it.
func TestCLIReference(t *testing.T) {
	f, _, _ := testFactory(nil)
	root := newRootCmd(f)
	root.DisableAutoGenTag = true
	gen := t.TempDir()
	if err := doc.GenMarkdownTree(root, gen); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join("..", "..", "docs", "cli")
	if *update {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		if err := os.CopyFS(dir, os.DirFS(gen)); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, _ := filepath.Glob(filepath.Join(gen, "*.md"))
	have, _ := filepath.Glob(filepath.Join(dir, "*.md"))
	if len(want) != len(have) {
		t.Fatalf("docs/cli has %d pages, the commands make %d: run 'make docs'", len(have), len(want))
	}
	for _, w := range want {
		wb, _ := os.ReadFile(w)
		hb, err := os.ReadFile(filepath.Join(dir, filepath.Base(w)))
		if errors.Is(err, os.ErrNotExist) || !bytes.Equal(wb, hb) {
			t.Errorf("docs/cli/%s is out of date: run 'make docs'", filepath.Base(w))
		}
	}
}

// TestHelpAndFlagErrorsNeverConnect runs commands that must not touch the network with a
// saved cluster whose SSH and API addresses count connections.
func TestHelpAndFlagErrorsNeverConnect(t *testing.T) {
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
	for _, args := range [][]string{{"--help"}, {"version", "--help"}, {"version", "--bogus"}, {"--cluster", "lab", "version"}, {"completion", "bash"}, {"-o", "xml", "version"}} {
		execute(t, args...) //nolint:errcheck // only the connections matter here
	}
	if n := accepted.Load(); n != 0 {
		t.Fatalf("%d connections were made", n)
	}
}

// TestUsageHintNamesTheCommand checks that a usage error points to the help of the command that
// failed, for every command (an unknown flag), and for install without --host.
func TestUsageHintNamesTheCommand(t *testing.T) {
	t.Setenv("KIP_HOME", t.TempDir())
	hint := func(args ...string) string {
		t.Helper()
		f, _, errOut := testFactory(nil)
		root := newRootCmd(f)
		root.SetArgs(args)
		root.SetOut(errOut)
		root.SetErr(errOut)
		cmd, err := root.ExecuteC()
		if cli.ExitCode(err) != cli.ExitUsage {
			t.Fatalf("%v: exit code %d (%v), want %d", args, cli.ExitCode(err), err, cli.ExitUsage)
		}
		errOut.Reset()
		printError(f.IO, cmd, err)
		return errOut.String()
	}
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"install"}, "error: --host is required: the server's address, e.g. kip install --host 203.0.113.10\nRun 'kip install --help' for usage.\n"},
		{[]string{"nope"}, "Run 'kip --help' for usage.\n"},
		{[]string{"--bogus"}, "Run 'kip --help' for usage.\n"},
		{[]string{"-o", "xml", "doctor"}, "Run 'kip doctor --help' for usage.\n"},
		{[]string{"version", "extra"}, "Run 'kip version --help' for usage.\n"},
		{[]string{"completion", "tcsh"}, "Run 'kip completion --help' for usage.\n"},
		{[]string{"platform", "enable", "grafana"}, "Run 'kip platform enable --help' for usage.\n"},
		{[]string{"platform", "profile", "set"}, "Run 'kip platform profile set --help' for usage.\n"},
	}
	f, _, _ := testFactory(nil)
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		args := append(strings.Fields(strings.TrimPrefix(c.CommandPath(), "kip")), "--no-such-flag")
		tests = append(tests, struct {
			args []string
			want string
		}{args, "Run '" + c.CommandPath() + " --help' for usage.\n"})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd(f))
	for _, tt := range tests {
		if got := hint(tt.args...); !strings.HasSuffix(got, tt.want) {
			t.Errorf("kip %s printed\n%s\nwant it to end with\n%s", strings.Join(tt.args, " "), got, tt.want)
		}
	}
}
