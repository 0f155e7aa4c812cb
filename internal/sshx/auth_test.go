package sshx

import (
	"context"
	"crypto/ed25519"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"kipper.run/kip/test/need"
	"kipper.run/kip/test/sshd"
)

// writeKey writes a new ed25519 key to a file, encrypted when passphrase is not empty.
func writeKey(t *testing.T, passphrase string) string {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	var block *pem.Block
	if passphrase == "" {
		block, err = ssh.MarshalPrivateKey(priv, "")
	} else {
		block, err = ssh.MarshalPrivateKeyWithPassphrase(priv, "", []byte(passphrase))
	}
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "id_ed25519")
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadEncryptedKey(t *testing.T) {
	path := writeKey(t, "s3cret")

	_, err := loadKey(path, nil)
	want := fmt.Sprintf("SSH key %s is encrypted: load it into ssh-agent (ssh-add %s) or run kip in a terminal", path, path)
	if err == nil || err.Error() != want {
		t.Errorf("without a terminal: %v, want %s", err, want)
	}

	var prompt string
	answer := func(pass string) func(string) ([]byte, error) {
		return func(p string) ([]byte, error) { prompt = p; return []byte(pass), nil }
	}
	if _, err := loadKey(path, answer("s3cret")); err != nil {
		t.Errorf("with the passphrase: %v", err)
	}
	if want := "Enter passphrase for " + path + ": "; prompt != want {
		t.Errorf("prompt %q, want %q", prompt, want)
	}
	if _, err := loadKey(path, answer("wrong")); err == nil || !strings.Contains(err.Error(), "wrong passphrase") {
		t.Errorf("with a wrong passphrase: %v", err)
	}
	refuse := func(string) ([]byte, error) { return nil, errors.New("no tty") }
	if _, err := loadKey(path, refuse); err == nil || !strings.Contains(err.Error(), "no tty") {
		t.Errorf("when the prompt fails: %v", err)
	}
	// An unencrypted key needs no prompt.
	if _, err := loadKey(writeKey(t, ""), refuse); err != nil {
		t.Errorf("unencrypted key: %v", err)
	}
}

func TestNoKeyNoAgent(t *testing.T) {
	t.Setenv("SSH_AUTH_SOCK", "")
	_, err := Dial(context.Background(), Config{Host: "203.0.113.10", SSHConfigPath: "/dev/null"})
	if err == nil {
		t.Fatal("Dial without a key or agent succeeded")
	}
	for _, want := range []string{"ssh root@203.0.113.10:22: ", "--ssh-key", "KIP_SSH_KEY", "ssh-agent"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// startAgent starts a real ssh-agent listening on a socket that SSH_AUTH_SOCK then names.
func startAgent(t *testing.T) string {
	need.Command(t, "ssh-agent", "apt-get install openssh-client")
	sock := filepath.Join(t.TempDir(), "agent.sock")
	agent := exec.Command("ssh-agent", "-D", "-a", sock)
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { agent.Process.Kill(); agent.Wait() })
	if !eventually(5*time.Second, func() bool {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
		}
		return err == nil
	}) {
		t.Fatal("ssh-agent did not start")
	}
	t.Setenv("SSH_AUTH_SOCK", sock)
	return sock
}

func TestAgentAuth(t *testing.T) {
	srv := sshd.Start(t)
	startAgent(t)
	cfg, _ := testConfig(t, srv, sshd.User)
	cfg.KeyPath = ""

	if _, err := Dial(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "ssh-agent holds no keys") {
		t.Fatalf("Dial with an empty agent: %v", err)
	}
	if out, err := exec.Command(need.Command(t, "ssh-add", "apt-get install openssh-client"), srv.ClientKeyPath).CombinedOutput(); err != nil {
		t.Fatalf("ssh-add: %v: %s", err, out)
	}
	c := dial(t, cfg)
	if got := mustRun(t, c, "id -u"); got != "0\n" {
		t.Errorf("id -u = %q", got)
	}
}

func TestRefusedKeyIsNotRetried(t *testing.T) {
	srv := sshd.Start(t)
	cfg, n := testConfig(t, srv, sshd.User)
	cfg.KeyPath = writeKey(t, "")
	_, err := Dial(context.Background(), cfg)
	want := fmt.Sprintf("ssh kiptest@%s: the server refused key %s for user kiptest: ", srv.Addr(), cfg.KeyPath)
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("Dial with an unknown key: %v, want %s...", err, want)
	}
	if n.count("retrying") != 0 {
		t.Errorf("an authentication failure was retried: %q", n.list())
	}
}
