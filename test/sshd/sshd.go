// Package sshd runs a real OpenSSH sshd on 127.0.0.1 for tests. It needs root: it creates two
// test users, User (with passwordless sudo) and NoSudoUser, both with /bin/sh as their shell
// (root's shell on the build machines sources a ~/.bashrc that adds about 0.5 s to every
// command), and one client key that logs in as either, and as root.
package sshd

import (
	"bytes"
	"crypto/ed25519"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gofrs/flock"
	"golang.org/x/crypto/ssh"

	"kipper.run/kip/test/need"
)

// The test users.
const (
	User       = "kiptest"   // may run anything with sudo, without a password
	NoSudoUser = "kipnosudo" // may not use sudo
)

const (
	sshdPath    = "/usr/sbin/sshd"
	sudoersPath = "/etc/sudoers.d/" + User
	sudoersLine = User + " ALL=(ALL) NOPASSWD: ALL\n"
	// usersLock serialises user creation among test binaries running in parallel.
	usersLock = "/run/kip-test-sshd-users.lock"
)

// Server is a running sshd.
type Server struct {
	Host          string // 127.0.0.1
	Port          int
	ClientKeyPath string // an unencrypted ed25519 key authorized for User, NoSudoUser and root

	dir     string
	hostKey ssh.PublicKey
	cmd     *exec.Cmd
	exited  chan struct{}
}

// Start starts an sshd on a free port of 127.0.0.1 and stops it when the test ends. It skips
// the test (fails it under CI=true) when not root or when sshd or sudo is not installed.
func Start(t testing.TB) *Server {
	t.Helper()
	need.Root(t)
	if _, err := os.Stat(sshdPath); err != nil {
		need.Missing(t, "%s not found (apt-get install openssh-server)", sshdPath)
	}
	need.Command(t, "sudo", "apt-get install sudo")
	ensureUsers(t)

	// Not t.TempDir: sshd reads authorized_keys as the logging-in user, who must be able to
	// enter the directory.
	dir, err := os.MkdirTemp("", "kip-sshd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s := &Server{Host: "127.0.0.1", dir: dir, ClientKeyPath: filepath.Join(dir, "client_ed25519")}
	must(t, os.Chmod(dir, 0o755))
	must(t, os.Mkdir(filepath.Join(dir, "authorized_keys"), 0o755))
	clientKey := writeKey(t, s.ClientKeyPath)
	for _, u := range []string{"root", User, NoSudoUser} {
		must(t, os.WriteFile(filepath.Join(dir, "authorized_keys", u), ssh.MarshalAuthorizedKey(clientKey), 0o644))
	}
	s.hostKey = writeKey(t, s.hostKeyPath())

	// A port picked now may be taken before sshd binds it: try a few.
	for attempt := 1; ; attempt++ {
		s.Port = freePort(t)
		s.writeConfig(t)
		err := s.start()
		if err == nil {
			break
		}
		if attempt == 3 {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if log := s.log(); t.Failed() && log != "" {
			t.Logf("sshd log:\n%s", log)
		}
	})
	t.Cleanup(s.stop)
	return s
}

// Addr returns host:port.
func (s *Server) Addr() string { return net.JoinHostPort(s.Host, strconv.Itoa(s.Port)) }

// HostKey returns the server's current host key.
func (s *Server) HostKey() ssh.PublicKey { return s.hostKey }

// RestartWithNewHostKey restarts sshd on the same port with a newly generated host key, as if
// the host had been reinstalled. Established connections are not affected.
func (s *Server) RestartWithNewHostKey(t testing.TB) {
	t.Helper()
	s.stopListener()
	s.hostKey = writeKey(t, s.hostKeyPath())
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
}

// Connections returns the number of client connections sshd is serving: each has a process
// of its own, a child of the listening sshd.
func (s *Server) Connections() int { return len(children(s.cmd.Process.Pid)) }

// KillConnections kills the sshd processes serving client connections, dropping them as a
// network failure or a crashed host would. Commands running in those connections are left
// alone. Each connection's processes die child first, and the processes are read again until
// none is left: below the listener, or in a connection's session (sshd starts one for each), where
// a child stays when its monitor forked it just before the monitor died, and it left the tree.
func (s *Server) KillConnections() {
	listener := s.cmd.Process.Pid
	own := session(listener)
	sessions := map[int]bool{}
	for {
		var sshds []int
		for _, pid := range descendants(listener) {
			if comm(pid) == "sshd" {
				sshds = append(sshds, pid)
				if sid := session(pid); sid != own && sid > 0 {
					sessions[sid] = true
				}
			}
		}
		for pid := range parents() {
			if sessions[session(pid)] && comm(pid) == "sshd" && !slices.Contains(sshds, pid) {
				sshds = append(sshds, pid)
			}
		}
		if len(sshds) == 0 {
			return
		}
		for _, pid := range slices.Backward(sshds) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func (s *Server) hostKeyPath() string { return filepath.Join(s.dir, "host_ed25519") }

func (s *Server) logPath() string { return filepath.Join(s.dir, "sshd.log") }

// log returns what sshd has logged (LogLevel ERROR).
func (s *Server) log() string {
	b, _ := os.ReadFile(s.logPath())
	return string(b)
}

func (s *Server) writeConfig(t testing.TB) {
	cfg := fmt.Sprintf(`ListenAddress %s
HostKey %s
AuthorizedKeysFile %s/authorized_keys/%%u
AllowUsers root %s %s
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
StrictModes no
PidFile %s/sshd.pid
MaxStartups 100
MaxSessions 10
LogLevel ERROR
`, s.Addr(), s.hostKeyPath(), s.dir, User, NoSudoUser, s.dir)
	must(t, os.WriteFile(filepath.Join(s.dir, "sshd_config"), []byte(cfg), 0o644))
}

// start runs sshd in the foreground as a child and waits until it accepts connections.
func (s *Server) start() error {
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil { // sshd's privilege separation directory
		return err
	}
	// sshd logs to a file rather than to a pipe: exec.Cmd.Wait would wait for the pipe to close,
	// and the processes serving connections, which outlive a restart, hold it open.
	log, err := os.OpenFile(s.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	s.cmd = exec.Command(sshdPath, "-D", "-e", "-f", filepath.Join(s.dir, "sshd_config"))
	s.cmd.Stderr = log
	if err := s.cmd.Start(); err != nil {
		return err
	}
	s.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) {
		cmd.Wait()
		close(exited)
	}(s.cmd, s.exited)

	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-s.exited:
			return fmt.Errorf("sshd exited: %s", s.log())
		default:
		}
		if s.probe() {
			// Let the process that served the probe exit, so that Connections counts clients.
			for len(children(s.cmd.Process.Pid)) > 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			return nil
		}
		if time.Now().After(deadline) {
			s.stopListener()
			return fmt.Errorf("sshd does not accept connections on %s: %s", s.Addr(), s.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// probe reports whether sshd answers with its identification. It sends one back before
// leaving, so that sshd has no protocol error to log.
func (s *Server) probe() bool {
	c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	banner := make([]byte, 4)
	if _, err := io.ReadFull(c, banner); err != nil || string(banner) != "SSH-" {
		return false
	}
	_, err = c.Write([]byte("SSH-2.0-kip-probe\r\n"))
	return err == nil
}

// stop drops every connection and stops sshd.
func (s *Server) stop() {
	s.KillConnections()
	s.stopListener()
}

func (s *Server) stopListener() {
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(5 * time.Second):
		s.cmd.Process.Kill()
		<-s.exited
	}
}

// ensureUsers creates the test users if needed and makes them usable: unlocked (with UsePAM
// no, sshd refuses locked accounts), /bin/sh as shell, and sudo for User.
func ensureUsers(t testing.TB) {
	lock := flock.New(usersLock)
	must(t, lock.Lock())
	defer lock.Unlock()
	for _, u := range []string{User, NoSudoUser} {
		if _, err := user.Lookup(u); err != nil {
			run(t, "useradd", "--create-home", "--home-dir", "/home/"+u, "--shell", "/bin/sh", u)
		}
		run(t, "usermod", "--password", "*", "--shell", "/bin/sh", u)
	}
	if b, err := os.ReadFile(sudoersPath); err != nil || string(b) != sudoersLine {
		tmp := sudoersPath + ".tmp" // sudo ignores files whose names contain a dot
		must(t, os.WriteFile(tmp, []byte(sudoersLine), 0o440))
		must(t, os.Rename(tmp, sudoersPath))
	}
}

// writeKey writes a new ed25519 private key in OpenSSH format to path and returns its public key.
func writeKey(t testing.TB, path string) ssh.PublicKey {
	pub, priv, err := ed25519.GenerateKey(nil)
	must(t, err)
	block, err := ssh.MarshalPrivateKey(priv, "kip test")
	must(t, err)
	must(t, os.WriteFile(path, pem.EncodeToMemory(block), 0o600))
	key, err := ssh.NewPublicKey(pub)
	must(t, err)
	return key
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func run(t testing.TB, name string, args ...string) {
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// parents maps each process that has not ended to its parent, from /proc.
func parents() map[int]int {
	m := make(map[int]int)
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if fields := statFields(pid); len(fields) >= 2 && fields[0] != "Z" { // a zombie has ended: it serves no connection
			if ppid, err := strconv.Atoi(fields[1]); err == nil {
				m[pid] = ppid
			}
		}
	}
	return m
}

// session is the session of pid, 0 when it has gone.
func session(pid int) int {
	if fields := statFields(pid); len(fields) >= 4 {
		sid, _ := strconv.Atoi(fields[3])
		return sid
	}
	return 0
}

// statFields are the fields of /proc/PID/stat after the command name: state, ppid, pgrp,
// session, …; none when the process has gone.
func statFields(pid int) []string {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	// "pid (comm) state ppid ...": comm may contain spaces and parentheses.
	return strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
}

// childrenOf maps each process to its children.
func childrenOf() map[int][]int {
	kids := make(map[int][]int)
	for pid, ppid := range parents() {
		kids[ppid] = append(kids[ppid], pid)
	}
	return kids
}

func children(pid int) []int { return childrenOf()[pid] }

func descendants(pid int) []int {
	kids := childrenOf()
	var out []int
	for queue := kids[pid]; len(queue) > 0; queue = queue[1:] {
		out = append(out, queue[0])
		queue = append(queue, kids[queue[0]]...)
	}
	return out
}

func comm(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return strings.TrimSpace(string(b))
}
