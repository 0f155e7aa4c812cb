package sshx

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"kipper.run/kip/test/sshd"
)

func TestTrustOnFirstUseThenRefuseChangedKey(t *testing.T) {
	srv := sshd.Start(t)
	cfg, n := testConfig(t, srv, sshd.User)
	oldFP := ssh.FingerprintSHA256(srv.HostKey())

	dial(t, cfg).Close()
	want := fmt.Sprintf("Trusted new host key for %s (%s), saved in %s", srv.Addr(), oldFP, cfg.KnownHostsPath)
	if got := n.list(); !slices.Equal(got, []string{want}) {
		t.Fatalf("notices %q, want %q", got, want)
	}
	data, err := os.ReadFile(cfg.KnownHostsPath)
	if err != nil {
		t.Fatal(err)
	}
	if line := knownhosts.Line([]string{srv.Addr()}, srv.HostKey()) + "\n"; string(data) != line {
		t.Errorf("known_hosts = %q, want %q", data, line)
	}
	for path, mode := range map[string]os.FileMode{cfg.KnownHostsPath: 0o600, filepath.Dir(cfg.KnownHostsPath): 0o700 | os.ModeDir} {
		if fi, err := os.Stat(path); err != nil || fi.Mode() != mode {
			t.Errorf("%s: mode %v (%v), want %v", path, fi.Mode(), err, mode)
		}
	}

	// Known now: no notice, no new line.
	dial(t, cfg).Close()
	if len(n.list()) != 1 {
		t.Errorf("second dial: notices %q", n.list())
	}

	srv.RestartWithNewHostKey(t)
	_, err = Dial(context.Background(), cfg)
	if err == nil {
		t.Fatal("Dial accepted a changed host key")
	}
	for _, want := range []string{
		"ssh kiptest@" + srv.Addr() + ": host key for " + srv.Addr() + " has changed: ",
		"ssh-ed25519 " + ssh.FingerprintSHA256(srv.HostKey()),           // offered
		"ssh-ed25519 " + oldFP + " (" + cfg.KnownHostsPath + " line 1)", // known
		"remove line 1 from " + cfg.KnownHostsPath,
		fmt.Sprintf("ssh-keygen -f %s -R '[127.0.0.1]:%d'", cfg.KnownHostsPath, srv.Port),
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q\ndoes not contain %q", err, want)
		}
	}
	if len(n.list()) != 1 {
		t.Errorf("a refused host key was retried or trusted: %q", n.list())
	}
}

// TestTrustOnFirstUseConcurrently has several kips meet a new host at once: the file lock
// leaves one line and one notice.
func TestTrustOnFirstUseConcurrently(t *testing.T) {
	srv := sshd.Start(t)
	cfg, n := testConfig(t, srv, sshd.User)
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			c, err := Dial(context.Background(), cfg)
			if err != nil {
				t.Error(err)
				return
			}
			c.Close()
		})
	}
	wg.Wait()
	data, err := os.ReadFile(cfg.KnownHostsPath)
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(string(data), "\n"); lines != 1 || len(n.list()) != 1 {
		t.Errorf("%d lines in known_hosts, notices %q; want one of each", lines, n.list())
	}
}

func TestHostKeyAlgorithms(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	rsaPub, err := ssh.NewPublicKey(&rsaKey.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	ed := probeKey()
	for _, tc := range []struct {
		known []ssh.PublicKey
		want  []string
	}{
		{nil, nil},
		{[]ssh.PublicKey{ed}, []string{"ssh-ed25519"}},
		{[]ssh.PublicKey{rsaPub, ed, ed}, []string{"rsa-sha2-512", "rsa-sha2-256", "ssh-rsa", "ssh-ed25519"}},
	} {
		var known []knownhosts.KnownKey
		for _, k := range tc.known {
			known = append(known, knownhosts.KnownKey{Key: k})
		}
		if got := hostKeyAlgorithms(known); !slices.Equal(got, tc.want) {
			t.Errorf("hostKeyAlgorithms(%d keys) = %q, want %q", len(known), got, tc.want)
		}
	}
}

// TestKnownKeyTypeIsNegotiated checks that a Client asks for the type of key it knows: with an
// RSA key on file, it must not accept the server's ed25519 key as if it were a new host.
func TestKnownKeyTypeIsNegotiated(t *testing.T) {
	srv := sshd.Start(t)
	cfg, n := testConfig(t, srv, sshd.User)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	rsaPub, err := ssh.NewPublicKey(&rsaKey.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(cfg.KnownHostsPath), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg.KnownHostsPath, []byte(knownhosts.Line([]string{srv.Addr()}, rsaPub)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Dial(context.Background(), cfg)
	want := fmt.Sprintf("host key for %s has changed: the server offers no key of the type kip knows, ssh-rsa %s (%s line 1); ",
		srv.Addr(), ssh.FingerprintSHA256(rsaPub), cfg.KnownHostsPath)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Dial = %v\nwant %s...", err, want)
	}
	if len(n.list()) != 0 {
		t.Errorf("notices %q, want none", n.list())
	}
}
