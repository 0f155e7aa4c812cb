package cli

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/config"
	"kipper.run/kip/test/tcpcount"
)

// saveCluster writes a KIP_HOME whose one cluster points at addr for both SSH and the API.
func saveCluster(t *testing.T, addr string) {
	t.Helper()
	home := t.TempDir()
	t.Setenv("KIP_HOME", home)
	kc := filepath.Join(home, "kubeconfig")
	err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://`+addr+`", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	err = config.Store{Dir: home}.Update(func(c *config.Config) error {
		c.Put(config.Cluster{Name: "lab", Host: host, SSHPort: p, SSHUser: "saved", SSHKey: "/saved/key", Kubeconfig: kc})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestKubeClientsAreLazy(t *testing.T) {
	addr, accepted := tcpcount.Listen(t)
	saveCluster(t, addr)
	io, _ := streams(false, nil)
	f := NewFactory(io)
	c, err := f.Kube()
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := f.Kube(); again != c {
		t.Fatal("Kube() built the clients twice")
	}
	if n := accepted.Load(); n != 0 {
		t.Fatalf("building clients made %d connections, want 0", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, _ = c.Kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}) // the first request dials
	if accepted.Load() == 0 {
		t.Fatal("the API request did not reach the saved cluster's server")
	}
}

func TestSSHConfigResolution(t *testing.T) {
	saved := &config.Cluster{Name: "lab", Host: "203.0.113.10", SSHUser: "saved", SSHPort: 2222, SSHKey: "/saved/key"}
	tests := []struct {
		name     string
		global   GlobalOptions
		env      map[string]string
		saved    *config.Cluster
		wantKey  string
		wantUser string
	}{
		{"saved", GlobalOptions{SSHUser: "root"}, nil, saved, "/saved/key", "saved"},
		{"env beats saved", GlobalOptions{SSHUser: "root"}, map[string]string{"KIP_SSH_KEY": "/env/key"}, saved, "/env/key", "saved"},
		{"flag beats env", GlobalOptions{SSHKey: "/flag/key", SSHUser: "ops", SSHUserSet: true}, map[string]string{"KIP_SSH_KEY": "/env/key"}, saved, "/flag/key", "ops"},
		{"nothing saved leaves ssh config and agent", GlobalOptions{SSHUser: "root"}, nil, nil, "", ""},
	}
	t.Setenv("KIP_HOME", t.TempDir())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			io, _ := streams(false, tt.env)
			f := NewFactory(io)
			f.Global = tt.global
			c, err := f.SSHConfig("203.0.113.10", tt.saved)
			if err != nil {
				t.Fatal(err)
			}
			if c.KeyPath != tt.wantKey || c.User != tt.wantUser {
				t.Fatalf("key %q user %q, want %q %q", c.KeyPath, c.User, tt.wantKey, tt.wantUser)
			}
			if c.KnownHostsPath != filepath.Join(os.Getenv("KIP_HOME"), "known_hosts") {
				t.Fatalf("known_hosts %q is not kip's own", c.KnownHostsPath)
			}
			if c.Passphrase != nil {
				t.Fatal("a passphrase prompt off a terminal")
			}
		})
	}
}

func TestSSHDialFailureIsReported(t *testing.T) {
	addr, accepted := tcpcount.Listen(t)
	saveCluster(t, addr)
	io, _ := streams(false, map[string]string{"KIP_SSH_KEY": filepath.Join(t.TempDir(), "missing")})
	f := NewFactory(io)
	cl, err := f.Cluster()
	if err != nil {
		t.Fatal(err)
	}
	c, err := f.SSHConfig(cl.Host, cl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.SSH(context.Background(), c); err == nil {
		t.Fatal("dial with a missing key succeeded")
	}
	if accepted.Load() != 0 {
		t.Fatal("kip connected before it had a usable key")
	}
}

// TestCommandLine: lock holders name the whole command, quoted so that "continue with" hints
// run as written.
func TestCommandLine(t *testing.T) {
	f := NewFactory(&IOStreams{})
	f.Args = []string{"install", "--host", "203.0.113.10", "--admin-email", "admin@example.com", "--airgap-bundle", "./k3s bundle"}
	want := "kip install --host 203.0.113.10 --admin-email admin@example.com --airgap-bundle './k3s bundle'"
	if got := f.CommandLine(); got != want {
		t.Errorf("CommandLine = %q, want %q", got, want)
	}
}

// TestSSHPortIsTheServers: the saved SSH port is the server's; other nodes of the cluster are not
// dialled on it.
func TestSSHPortIsTheServers(t *testing.T) {
	t.Setenv("KIP_HOME", t.TempDir())
	f := NewFactory(&IOStreams{Getenv: func(string) string { return "" }})
	saved := &config.Cluster{Name: "c", Host: "203.0.113.10", SSHPort: 2222}
	server, err := f.SSHConfig("203.0.113.10", saved)
	if err != nil || server.Port != 2222 {
		t.Errorf("server: port %d, %v; want 2222", server.Port, err)
	}
	worker, err := f.SSHConfig("203.0.113.11", saved)
	if err != nil || worker.Port != 0 {
		t.Errorf("worker: port %d, %v; want 0 (its own: ~/.ssh/config or 22)", worker.Port, err)
	}
}

// TestPassphraseReadsTheFactorysInput: the passphrase prompt reads the factory's input stream
// (before, os.Stdin whatever the factory was given).
func TestPassphraseReadsTheFactorysInput(t *testing.T) {
	var errOut strings.Builder
	f := NewFactory(&IOStreams{In: strings.NewReader("correct horse\n"), ErrOut: &errOut, Getenv: func(string) string { return "" }})
	got, err := f.readPassphrase("Passphrase for key: ")
	if err != nil || string(got) != "correct horse" || !strings.HasPrefix(errOut.String(), "Passphrase for key: ") {
		t.Errorf("passphrase %q, %v; prompt %q", got, err, errOut.String())
	}
	if _, err := NewFactory(&IOStreams{In: strings.NewReader(""), ErrOut: &errOut}).readPassphrase("p: "); err == nil {
		t.Error("no input: want an error")
	}
}
