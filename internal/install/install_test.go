package install

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/components"
)

func TestOptionsValidate(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	full := &components.BackupStorage{Bucket: "b", AccessKeyID: "id", SecretAccessKey: "s3cr3t"}
	tests := []struct {
		name string
		o    Options
		want string // "" for valid
	}{
		{"minimal", Options{Host: "203.0.113.10"}, ""},
		{"everything", Options{Host: "srv.example.com", AdminEmail: "a@example.com", Profile: "small", Storage: "longhorn", Backups: full, AirgapBundle: dir, SSHPort: 2222}, ""},
		{"no host", Options{}, "--host is required"},
		{"user in host", Options{Host: "root@203.0.113.10"}, "--ssh-user"},
		{"bad email", Options{Host: "h", AdminEmail: "admin"}, "is not an email address"},
		{"named email", Options{Host: "h", AdminEmail: "Admin <a@example.com>"}, "is not an email address"},
		{"bad profile", Options{Host: "h", Profile: "huge"}, `unknown profile "huge"`},
		{"bad storage", Options{Host: "h", Storage: "nfs"}, "choose local or longhorn"},
		{"bad port", Options{Host: "h", SSHPort: 70000}, "--ssh-port"},
		{"bucket only", Options{Host: "h", Backups: &components.BackupStorage{Bucket: "b"}}, "--backup-storage-access-key-id, --backup-storage-secret-access-key-file"},
		{"ipv6", Options{Host: "2001:db8::10"}, ""},
		{"ssh config alias", Options{Host: "lab_server"}, ""},
		{"octet over 255", Options{Host: "999.1.1.1"}, "not an IPv4 address"},
		{"256", Options{Host: "256.1.1.1"}, "not an IPv4 address"},
		{"three numbers", Options{Host: "10.1.1"}, "not an IPv4 address"},
		{"a flag", Options{Host: "-x"}, "give the host's address or name"},
		{"with a port", Options{Host: "198.51.100.11:2222"}, "--host 198.51.100.11 --ssh-port 2222"},
		{"ipv6 with a port", Options{Host: "[2001:db8::10]:2222"}, "--ssh-port 2222"},
		{"bad name", Options{Host: "srv..example.com"}, "not an IP address or a host name"},
		{"port 0 given", Options{Host: "h", SSHPort: 0, SSHPortSet: true}, "--ssh-port 0"},
		{"bundle is a file", Options{Host: "h", AirgapBundle: file}, "not a directory"},
		{"bundle missing", Options{Host: "h", AirgapBundle: filepath.Join(dir, "none")}, "not a directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.o.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			case err != nil && cli.ExitCode(err) != cli.ExitUsage:
				t.Fatalf("exit code %d, want usage", cli.ExitCode(err))
			case err != nil && strings.Contains(err.Error(), "s3cr3t"):
				t.Fatal("the error shows the secret key")
			}
		})
	}
}

func TestSafeFileName(t *testing.T) {
	for in, want := range map[string]string{"203.0.113.10": "203.0.113.10", "a/b c": "a_b_c", "::1": "__1"} {
		if got := safeFileName(in); got != want {
			t.Errorf("safeFileName(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestRestartedSince: whether k3s restarted since kip looked is decided by systemd's invocation
// ID. Before, kip compared the unit's ActiveEnterTimestamp (the host's clock) with its own start
// (the operator's clock): a host 10 minutes ahead counted a k3s that had not restarted as
// restarted, and one behind restarted k3s again on every check.
func TestRestartedSince(t *testing.T) {
	for _, tt := range []struct {
		name   string
		before string
		u      unitState
		want   bool
	}{
		{"same run", "a1", unitState{active: true, invocation: "a1"}, false},
		{"restarted", "a1", unitState{active: true, invocation: "b2"}, true},
		{"started after being stopped", "", unitState{active: true, invocation: "b2"}, true},
		{"not running now", "a1", unitState{state: "failed", invocation: ""}, false},
		{"activating, no ID yet", "", unitState{state: "activating"}, false},
	} {
		if got := restartedSince(tt.before, tt.u); got != tt.want {
			t.Errorf("%s: restartedSince = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestBackupAndRestoreFiles runs the backup and restore commands in a real shell: every file
// kip rewrites (config.yaml, the audit policy, the authentication config) gets its previous
// content back, and one that did not exist before is removed again. Before, only config.yaml was
// kept, and a restore left a new authentication config beside the old config.yaml.
