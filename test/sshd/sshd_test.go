package sshd

import (
	"bytes"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// dial logs in as user with the server's client key, checking the host key.
func dial(t *testing.T, s *Server, user string) *ssh.Client {
	t.Helper()
	signer := clientSigner(t, s)
	c, err := ssh.Dial("tcp", s.Addr(), &ssh.ClientConfig{
		User:            user,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: ssh.FixedHostKey(s.HostKey()),
		Timeout:         5 * time.Second,
	})
	if err != nil {
		t.Fatalf("dial %s as %s: %v", s.Addr(), user, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func clientSigner(t *testing.T, s *Server) ssh.Signer {
	t.Helper()
	out, err := os.ReadFile(s.ClientKeyPath)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.ParsePrivateKey(out)
	if err != nil {
		t.Fatal(err)
	}
	return signer
}

func output(t *testing.T, c *ssh.Client, cmd string) string {
	t.Helper()
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	out, err := sess.CombinedOutput(cmd)
	if err != nil {
		t.Fatalf("%s: %v: %s", cmd, err, out)
	}
	return strings.TrimSpace(string(out))
}

func TestUsersAndSudo(t *testing.T) {
	s := Start(t)
	c := dial(t, s, User)
	if got := output(t, c, "id -un"); got != User {
		t.Errorf("id -un = %q, want %q", got, User)
	}
	if got := output(t, c, "echo $0"); got != "sh" && got != "/bin/sh" {
		t.Errorf("login shell runs as %q, want sh", got)
	}
	if got := output(t, c, "sudo -n id -u"); got != "0" {
		t.Errorf("sudo -n id -u = %q, want 0", got)
	}
	if got := output(t, dial(t, s, "root"), "id -u"); got != "0" {
		t.Errorf("id -u as root = %q, want 0", got)
	}

	n := dial(t, s, NoSudoUser)
	sess, err := n.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if out, err := sess.CombinedOutput("sudo -n true"); err == nil {
		t.Errorf("sudo -n true as %s succeeded, want a refusal: %s", NoSudoUser, out)
	}
}

func TestStartTwiceIsIdempotent(t *testing.T) {
	a, b := Start(t), Start(t)
	if a.Port == b.Port {
		t.Fatalf("both servers on port %d", a.Port)
	}
	dial(t, a, User)
	dial(t, b, User)
}

func TestRestartWithNewHostKey(t *testing.T) {
	s := Start(t)
	old := s.HostKey()
	c := dial(t, s, User)
	s.RestartWithNewHostKey(t)
	if bytes.Equal(old.Marshal(), s.HostKey().Marshal()) {
		t.Fatal("host key did not change")
	}
	// The established connection survives; a new one presents the new key.
	output(t, c, "true")
	_, err := ssh.Dial("tcp", s.Addr(), &ssh.ClientConfig{
		User:            User,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(clientSigner(t, s))},
		HostKeyCallback: ssh.FixedHostKey(old),
		Timeout:         5 * time.Second,
	})
	if err == nil {
		t.Fatal("the old host key still verifies after the restart")
	}
	dial(t, s, User)
}

func TestConnectionsAndKillConnections(t *testing.T) {
	s := Start(t)
	if n := s.Connections(); n != 0 {
		t.Fatalf("Connections() = %d before any client, want 0", n)
	}
	c1, c2 := dial(t, s, User), dial(t, s, User)
	if n := s.Connections(); n != 2 {
		t.Fatalf("Connections() = %d, want 2", n)
	}
	s.KillConnections()
	for _, c := range []*ssh.Client{c1, c2} {
		done := make(chan error, 1)
		go func() { done <- c.Wait() }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("connection still open after KillConnections")
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.Connections() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("Connections() = %d after KillConnections, want 0", s.Connections())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The server still accepts new connections.
	if c, err := net.DialTimeout("tcp", s.Addr(), time.Second); err != nil {
		t.Fatal(err)
	} else {
		c.Close()
	}
	dial(t, s, User)
}
