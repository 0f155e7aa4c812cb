package main

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"kipper.run/kip/internal/backup"
	"kipper.run/kip/internal/cli"
)

// TestBackupWiring checks what each kip backup command hands to internal/backup.
func TestBackupWiring(t *testing.T) {
	var got any
	runners := backupRunners{
		create:   func(o *backup.CreateOptions) error { got = o; return nil },
		list:     func(o *backup.ListOptions) error { got = o; return nil },
		describe: func(o *backup.DescribeOptions) error { got = o; return nil },
		restore:  func(o *backup.RestoreOptions) error { got = o; return nil },
		drill:    func(o *backup.DrillOptions) error { got = o; return nil },
		repoKey:  func(o *backup.ExportOptions) error { got = o; return errors.New("repository-key") },
		sseKey:   func(o *backup.ExportOptions) error { got = o; return errors.New("sse-key") },
	}
	run := func(args ...string) error {
		got = nil
		f, _, _ := testFactory(nil)
		f.Args = args
		return executeWith(f, args, func(f *cli.Factory) *cobra.Command { return newBackupCmd(f, runners) })
	}

	if err := run("backup", "create", "--project", "shop", "--wait", "--ttl", "168h"); err != nil {
		t.Fatal(err)
	}
	c := got.(*backup.CreateOptions)
	if c.Project != "shop" || !c.Wait || c.TTL != 168*time.Hour || c.Holder != "kip backup create --project shop --wait --ttl 168h" || c.Kube == nil || c.Printer == nil {
		t.Errorf("create: %+v", c)
	}
	if err := run("backup", "create", "--namespace", "a,b", "--namespace", "c"); err != nil {
		t.Fatal(err)
	}
	if c := got.(*backup.CreateOptions); !slices.Equal(c.Namespaces, []string{"a", "b", "c"}) || c.TTL != backup.DefaultTTL || c.Wait {
		t.Errorf("create --namespace: %+v", c)
	}
	if err := run("backup", "create", "--project", "shop", "--namespace", "a"); cli.ExitCode(err) != 2 || got != nil {
		t.Errorf("--project with --namespace: %v (exit %d)", err, cli.ExitCode(err))
	}
	if err := run("backup", "list", "--project", "shop", "-o", "json"); err != nil || got.(*backup.ListOptions).Project != "shop" || !got.(*backup.ListOptions).JSON {
		t.Errorf("list: %+v %v", got, err)
	}
	if err := run("backup", "describe", "shop-1"); err != nil || got.(*backup.DescribeOptions).Name != "shop-1" {
		t.Errorf("describe: %+v %v", got, err)
	}
	if err := run("backup", "describe"); cli.ExitCode(err) != 2 {
		t.Errorf("describe without a name: %v", err)
	}
	if err := run("backup", "restore", "shop-1", "--namespace", "shop-prod", "--namespace-mapping", "shop-prod:shop-prod-2"); err != nil {
		t.Fatal(err)
	}
	if r := got.(*backup.RestoreOptions); r.Name != "shop-1" || !slices.Equal(r.Namespaces, []string{"shop-prod"}) || r.Mapping["shop-prod"] != "shop-prod-2" {
		t.Errorf("restore: %+v", r)
	}
	if err := run("backup", "restore", "shop-1", "--namespace-mapping", "shop-prod"); cli.ExitCode(err) != 2 || got != nil {
		t.Errorf("a bad mapping: %v", err)
	}
	if err := run("backup", "drill", "shop-prod"); err != nil || got.(*backup.DrillOptions).Namespace != "shop-prod" {
		t.Errorf("drill: %+v %v", got, err)
	}
	for _, key := range []string{"repository-key", "sse-key"} {
		if err := run("backup", key, "export", "--to", "/tmp/k"); err == nil || err.Error() != key || got.(*backup.ExportOptions).To != "/tmp/k" {
			t.Errorf("%s export: %+v %v", key, got, err)
		}
		if err := run("backup", key, "export"); cli.ExitCode(err) != 2 || got != nil {
			t.Errorf("%s export without --to: %v", key, err)
		}
	}
}
