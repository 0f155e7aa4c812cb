package install

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/config"
	"kipper.run/kip/manifests"
)

func testInstaller(t *testing.T, o Options, st hostState) *installer {
	t.Helper()
	pinned, err := manifests.Pinned()
	if err != nil {
		t.Fatal(err)
	}
	ios := &cli.IOStreams{Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}, Getenv: func(string) string { return "" }}
	env := Env{Printer: cli.NewPrinter(ios), Prompter: cli.NewPrompter(ios, true), Store: config.Store{Dir: t.TempDir()},
		CommandLine: "kip install --host " + o.Host}
	return &installer{env: env, p: env.Printer, o: o, pinned: pinned, state: &st, started: time.Now(), address: o.Host}
}

var bucket = &cluster.BackupLocation{Bucket: "backups", Endpoint: "https://s3.example.com"}

func unfinished(backups string, loc *cluster.BackupLocation) *cluster.Intent {
	return &cluster.Intent{Profile: "nano", Storage: cluster.StorageLocal, Network: cluster.NetworkVXLAN,
		Backups: backups, BackupLocation: loc, AdminEmail: "admin@example.com",
		StartedBy: "kip install --host 203.0.113.10", StartedAt: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)}
}

func withKeys(loc *cluster.BackupLocation) *components.BackupStorage {
	return &components.BackupStorage{Bucket: loc.Bucket, Endpoint: loc.Endpoint, Region: loc.Region, AccessKeyID: "id", SecretAccessKey: "s3cr3t"}
}

// TestResumeOrRefuse: a run after an interrupted install continues its recorded intent, taking
// what its flags leave open from it, or refuses before changing anything, naming every flag that
// differs. Before, the run re-decided from its own flags, so a killed nano install run again with
// --storage longhorn went on with half of each.
func TestResumeOrRefuse(t *testing.T) {
	host := "203.0.113.10"
	for _, tt := range []struct {
		name   string
		o      Options
		intent *cluster.Intent
		want   string // "" when it resumes
	}{
		{"same flags", Options{Host: host, AdminEmail: "admin@example.com"}, unfinished(cluster.BackupsNone, nil), ""},
		{"no flags", Options{Host: host}, unfinished(cluster.BackupsNone, nil), ""},
		{"other storage", Options{Host: host, Storage: cluster.StorageLonghorn, Profile: "small"}, unfinished(cluster.BackupsNone, nil),
			"--profile small, where it has nano; --storage longhorn, where it has local"},
		{"other admin", Options{Host: host, AdminEmail: "ops@example.com"}, unfinished(cluster.BackupsNone, nil), "--admin-email ops@example.com, where it has admin@example.com"},
		{"backups added", Options{Host: host, Backups: withKeys(bucket)}, unfinished(cluster.BackupsNone, nil), "--backup-storage-bucket backups, where it has no backups"},
		{"backups without their keys", Options{Host: host}, unfinished(cluster.BackupsExternal, bucket), "run it again with the same --backup-storage-* flags"},
		{"backups again", Options{Host: host, Backups: withKeys(bucket)}, unfinished(cluster.BackupsExternal, bucket), ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			in := testInstaller(t, tt.o, hostState{intent: tt.intent})
			err := in.settle()
			if tt.want != "" {
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("settle: %v, want %q", err, tt.want)
				}
				if !strings.Contains(err.Error(), "started on "+host) {
					t.Errorf("the refusal does not say which install: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := in.intent()
			if !in.resumed || !got.Same(*tt.intent) {
				t.Fatalf("resumed %v with intent %+v, want %+v", in.resumed, got, *tt.intent)
			}
		})
	}
}

// TestRerunKeepsRecordedChoices: a re-run without flags keeps the recorded external backup
// storage (without credentials: the cluster keeps its own) and first admin.
func TestRerunKeepsRecordedChoices(t *testing.T) {
	in := testInstaller(t, Options{Host: "203.0.113.10"}, hostState{serverData: true})
	in.rerun, in.record = true, cluster.Record{Profile: "small", Storage: cluster.StorageLonghorn, Network: cluster.NetworkVXLAN,
		Server: "203.0.113.10", Backups: cluster.BackupsExternal, BackupLocation: bucket, AdminEmail: "admin@example.com"}
	if err := in.settle(); err != nil {
		t.Fatal(err)
	}
	if in.backups == nil || !in.backups.Location().Equal(bucket) || in.backups.AccessKeyID != "" || in.adminEmail != "admin@example.com" {
		t.Fatalf("backups %+v, admin %q", in.backups, in.adminEmail)
	}
	if u := in.intent(); u.Backups != cluster.BackupsExternal || u.Profile != "small" {
		t.Errorf("intent %+v", u)
	}

	// New flags replace the recorded bucket and its keys.
	other := &cluster.BackupLocation{Bucket: "new"}
	in = testInstaller(t, Options{Host: "203.0.113.10", Backups: withKeys(other)}, hostState{serverData: true})
	in.rerun, in.record = true, cluster.Record{Profile: "small", Storage: cluster.StorageLonghorn, Server: "203.0.113.10",
		Backups: cluster.BackupsExternal, BackupLocation: bucket}
	if err := in.settle(); err != nil || in.backups.Bucket != "new" || in.backups.SecretAccessKey != "s3cr3t" {
		t.Fatalf("settle %v, backups %+v", err, in.backups)
	}
}

func TestParseIntent(t *testing.T) {
	if u, err := parseIntent("\n"); u != nil || err != nil {
		t.Errorf("no file: %v %v", u, err)
	}
	if _, err := parseIntent("{not json"); err == nil || !strings.Contains(err.Error(), IntentPath) {
		t.Errorf("damaged: %v", err)
	}
	u, err := parseIntent(`{"profile":"nano","storage":"local","network":"vxlan","startedBy":"kip install","startedAt":"2026-12-01T10:00:00Z"}`)
	if err != nil || u.Profile != "nano" || u.Network != "vxlan" {
		t.Errorf("parse: %+v %v", u, err)
	}
}

// TestSavedKeyIsAbsolute: a relative --ssh-key was saved as given, so kip run later from another
// directory could not find the key.
func TestSavedKeyIsAbsolute(t *testing.T) {
	t.Chdir(t.TempDir())
	in := testInstaller(t, Options{Host: "203.0.113.10"}, hostState{})
	in.env.SSHKey = "keys/id_ed25519"
	in.name, in.kubePath = "203.0.113.10", "/tmp/kubeconfig"
	if err := in.saveCluster(); err != nil {
		t.Fatal(err)
	}
	cfg, err := in.env.Store.Load()
	if err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	if len(cfg.Clusters) != 1 || cfg.Clusters[0].SSHKey != filepath.Join(wd, "keys/id_ed25519") {
		t.Errorf("saved clusters %+v, want the key's absolute path", cfg.Clusters)
	}
}
