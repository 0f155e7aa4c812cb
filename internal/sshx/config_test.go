package sshx

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestResolve(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	sshConfig := filepath.Join(home, "ssh_config")
	if err := os.WriteFile(sshConfig, []byte(`
Host web
  HostName 203.0.113.10
  User deploy
  Port 2222
  IdentityFile ~/.ssh/web_ed25519

Host db-*
  User dbadmin
  IdentityFile %d/.ssh/id_%r_%n

Host bad-port
  Port http

Host noident
  IdentityFile none

Host *
  User ops
`), 0o600); err != nil {
		t.Fatal(err)
	}
	defaults := func(c Config) Config {
		c.KnownHostsPath = filepath.Join(home, ".kip", "known_hosts")
		c.Timeout = 10 * time.Second
		c.SSHConfigPath = sshConfig
		return c
	}
	for _, tc := range []struct {
		name    string
		in      Config
		want    Config
		wantErr string
	}{{
		name: "alias",
		in:   Config{Host: "web"},
		want: defaults(Config{Host: "203.0.113.10", Port: 2222, User: "deploy", KeyPath: home + "/.ssh/web_ed25519"}),
	}, {
		name: "flags win over the alias",
		in:   Config{Host: "web", Port: 22, User: "root", KeyPath: "/keys/id", KnownHostsPath: "/kh", Timeout: time.Second},
		want: Config{Host: "203.0.113.10", Port: 22, User: "root", KeyPath: "/keys/id", KnownHostsPath: "/kh", Timeout: time.Second, SSHConfigPath: sshConfig},
	}, {
		name: "pattern and tokens",
		in:   Config{Host: "db-1"},
		want: defaults(Config{Host: "db-1", Port: 22, User: "dbadmin", KeyPath: home + "/.ssh/id_dbadmin_db-1"}),
	}, {
		name: "tilde in a given key path",
		in:   Config{Host: "10.0.0.5", KeyPath: "~/id"},
		want: defaults(Config{Host: "10.0.0.5", Port: 22, User: "ops", KeyPath: home + "/id"}),
	}, {
		name: "IdentityFile none",
		in:   Config{Host: "noident"},
		want: defaults(Config{Host: "noident", Port: 22, User: "ops"}),
	}, {
		name:    "bad port",
		in:      Config{Host: "bad-port"},
		wantErr: `invalid Port "http" for host bad-port`,
	}, {
		name:    "no host",
		in:      Config{},
		wantErr: "no host given",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.in
			in.SSHConfigPath = sshConfig
			got, err := in.resolve()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("resolve() error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Host != tc.want.Host || got.Port != tc.want.Port || got.User != tc.want.User ||
				got.KeyPath != tc.want.KeyPath || got.KnownHostsPath != tc.want.KnownHostsPath || got.Timeout != tc.want.Timeout {
				t.Errorf("resolve() =\n %+v\nwant\n %+v", got, tc.want)
			}
		})
	}
}

func TestResolveSSHConfigFile(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	// Without ~/.ssh/config, kip's defaults apply.
	got, err := Config{Host: "h"}.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if got.User != "root" || got.Port != 22 || got.KeyPath != "" {
		t.Errorf("resolve() without an SSH config = %+v", got)
	}
	// ~/.ssh/config is the default.
	if err := os.Mkdir(filepath.Join(home, ".ssh"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, ".ssh", "config"), []byte("Host h\n  User admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := (Config{Host: "h"}).resolve(); err != nil || got.User != "admin" {
		t.Errorf("resolve() with ~/.ssh/config = %+v, %v; want user admin", got, err)
	}
	// A configuration file named explicitly must exist.
	if _, err := (Config{Host: "h", SSHConfigPath: filepath.Join(home, "missing")}).resolve(); err == nil {
		t.Error("resolve() with a missing SSH config file succeeded")
	}
}
