package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"kipper.run/kip/test/need"
)

// TestPostgresImage builds the postgres image and runs it as a container runtime would, as far
// as PostgreSQL needs: its layer unpacked into a root, chrooted into, in mount, PID and IPC
// namespaces of its own, with /proc, a tmpfs at /dev/shm and the host's /dev/null, /dev/zero and
// /dev/urandom bound onto empty files (no device node is created). The entrypoint initialises a
// database as the official image's does, the server answers on TCP, and the image's own clients
// dump a table with pg_dump and restore it into another database with pg_restore.
func TestPostgresImage(t *testing.T) {
	needBusybox(t)
	need.Root(t)
	for _, p := range []string{pgBin + "/postgres", pgBin + "/pg_restore"} {
		if _, err := os.Stat(p); err != nil {
			need.Missing(t, "%s: Debian's PostgreSQL 15 is not installed (make test-deps installs postgresql-15 and postgresql-client-15)", p)
		}
	}
	r := &rootRunner{
		sh:      need.Command(t, "sh", "a POSIX shell"),
		mount:   need.Command(t, "mount", "util-linux's mount"),
		chroot:  need.Command(t, "chroot", "coreutils' chroot"),
		ip:      need.Command(t, "ip", "make test-deps installs iproute2"),
		nsenter: need.Command(t, "nsenter", "util-linux's nsenter"),
	}
	began := time.Now()

	out1, out2 := t.TempDir(), t.TempDir()
	for _, out := range []string{out1, out2} {
		if err := build(setPostgres, "", testBusybox, out); err != nil {
			t.Fatal(err)
		}
	}
	archive := filepath.Join(out1, "postgres.tar")
	a1, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	if a2, _ := os.ReadFile(filepath.Join(out2, "postgres.tar")); !bytes.Equal(a1, a2) {
		t.Errorf("two builds gave different archives")
	}
	t.Logf("postgres.tar: %d bytes (two builds in %v)", len(a1), time.Since(began).Round(time.Millisecond))
	tag, err := name.NewTag("docker.io/library/postgres:15")
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(archive, &tag)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Config
	if !slices.Equal(c.Entrypoint, []string{"docker-entrypoint.sh"}) || !slices.Equal(c.Cmd, []string{"postgres"}) || c.StopSignal != "SIGINT" {
		t.Errorf("entrypoint %q cmd %q stop signal %q, want the official image's", c.Entrypoint, c.Cmd, c.StopSignal)
	}
	for _, want := range []string{"PGDATA=/var/lib/postgresql/data", "LANG=C.UTF-8"} {
		if !slices.Contains(c.Env, want) {
			t.Errorf("env %q has no %s", c.Env, want)
		}
	}
	r.env = c.Env

	r.root = filepath.Join(t.TempDir(), "root")
	unpack(t, img, r.root)
	// What a container runtime provides and PostgreSQL uses: the mount points and the files the
	// host's devices are bound onto.
	for _, d := range []string{"proc", "dev/shm"} {
		if err := os.MkdirAll(filepath.Join(r.root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"null", "zero", "urandom"} {
		if err := os.WriteFile(filepath.Join(r.root, "dev", f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Init files, as a user of the official image adds them: SQL run in POSTGRES_DB, and a script
	// that is not executable, so sourced.
	initdb := filepath.Join(r.root, "docker-entrypoint-initdb.d")
	if err := os.WriteFile(filepath.Join(initdb, "10-seed.sql"), []byte("CREATE TABLE seeded (n int);\nINSERT INTO seeded VALUES (1), (2);\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(initdb, "20-note.sh"), []byte(`echo "init script ran as $(id -un) for $POSTGRES_DB"`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	image := func(args ...string) []string { return append(slices.Clone(c.Entrypoint), args...) }

	t.Run("refuses without a password", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		b, err := r.command(ctx, "", []string{"PGDATA=/tmp/refused"}, image(c.Cmd...)...).CombinedOutput()
		if err == nil || !strings.Contains(string(b), "superuser password is not specified") {
			t.Errorf("the entrypoint with neither POSTGRES_PASSWORD nor POSTGRES_HOST_AUTH_METHOD=trust: %v\n%s", err, b)
		}
	})

	port := strconv.Itoa(freePort(t))
	srv := startContainer(t, r, "", []string{"POSTGRES_USER=kipper", "POSTGRES_DB=app", "POSTGRES_HOST_AUTH_METHOD=trust", "PGDATA=/tmp/pgdata"},
		image("postgres", "-c", "listen_addresses=127.0.0.1", "-p", port)...)
	srv.clientEnv = []string{"PGHOST=127.0.0.1", "PGPORT=" + port, "PGUSER=kipper"}
	client := func(args ...string) string {
		t.Helper()
		b, err := srv.client(nil, args...)
		if err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, b)
		}
		return strings.TrimSpace(string(b))
	}
	srv.waitReady(t, "app")
	if got := client("psql", "-d", "app", "-Atc",
		"SELECT current_user, current_setting('server_version_num')::int / 10000, (SELECT sum(n) FROM seeded)"); got != "kipper|15|3" {
		t.Errorf("user, major version and the init file's rows: %q, want kipper|15|3", got)
	}
	client("psql", "-d", "app", "-v", "ON_ERROR_STOP=1", "-qc",
		"CREATE TABLE items (id int PRIMARY KEY, name text); INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 1000) g;")
	client("pg_dump", "-Fc", "-d", "app", "-t", "items", "-f", "/tmp/app.dump")
	client("createdb", "scratch")
	client("pg_restore", "-d", "scratch", "/tmp/app.dump")
	if got := client("psql", "-d", "scratch", "-Atc", "SELECT count(*), sum(id) FROM items"); got != "1000|500500" {
		t.Errorf("scratch's items after pg_restore: %q, want 1000|500500", got)
	}
	if err := srv.stop(); err != nil {
		t.Errorf("the server after SIGINT: %v, want exit status 0", err)
	}
	log, _ := os.ReadFile(srv.logPath)
	for _, want := range []string{"init script ran as postgres for app", "PostgreSQL init process complete", "database system is shut down"} {
		if !strings.Contains(string(log), want) {
			t.Errorf("the container's output has no %q", want)
		}
	}

	// A new container on the same data directory, as a restarted pod on its volume: no
	// initialisation, the data kept.
	srv = startContainer(t, r, "", []string{"POSTGRES_USER=kipper", "POSTGRES_DB=app", "POSTGRES_HOST_AUTH_METHOD=trust", "PGDATA=/tmp/pgdata"},
		image("postgres", "-c", "listen_addresses=127.0.0.1", "-p", port)...)
	srv.clientEnv = []string{"PGHOST=127.0.0.1", "PGPORT=" + port, "PGUSER=kipper"}
	srv.waitReady(t, "app")
	if got := client("psql", "-d", "scratch", "-Atc", "SELECT count(*) FROM items"); got != "1000" {
		t.Errorf("scratch's items after a restart: %q, want 1000", got)
	}
	if err := srv.stop(); err != nil {
		t.Errorf("the restarted server after SIGINT: %v, want exit status 0", err)
	}
	if log, _ := os.ReadFile(srv.logPath); !strings.Contains(string(log), "Skipping initialization") || strings.Contains(string(log), "init script ran") {
		t.Errorf("the restarted container initialised again")
	}

	// With POSTGRES_PASSWORD (and the defaults: user and database postgres, port 5432), a
	// connection from another address needs the password (scram-sha-256); initdb's own lines
	// trust the loopback address, as in the official image. So this container has a network
	// namespace of its own, whose loopback interface also has 192.0.2.1.
	t.Run("password", func(t *testing.T) {
		srv := startContainer(t, r, netNew, []string{"POSTGRES_PASSWORD=s3cret pass", "PGDATA=/tmp/pwdata"}, image("-c", "listen_addresses=*")...)
		srv.clientEnv = []string{"PGHOST=" + netAddr, "PGUSER=postgres"}
		srv.waitReady(t, "postgres")
		if b, err := srv.client([]string{"PGPASSWORD=s3cret pass"}, "psql", "-Atc", "SELECT current_user, current_database(), inet_client_addr()"); err != nil || strings.TrimSpace(string(b)) != "postgres|postgres|"+netAddr {
			t.Errorf("psql with the password: %v, %q, want postgres|postgres|%s", err, b, netAddr)
		}
		if b, err := srv.client([]string{"PGPASSWORD=wrong"}, "psql", "-Atc", "SELECT 1"); err == nil || !strings.Contains(string(b), `password authentication failed for user "postgres"`) {
			t.Errorf("psql with a wrong password: %v, %q, want password authentication failed", err, b)
		}
		if err := srv.stop(); err != nil {
			t.Errorf("the server after SIGINT: %v, want exit status 0", err)
		}
	})

	// The mounts were the namespaces' only: none is left in this one.
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(mi), r.root) {
		t.Errorf("a mount under %s is left in the test's mount namespace", r.root)
	}
	t.Logf("built, unpacked, initialised, dumped, restored and stopped in %v", time.Since(began).Round(time.Millisecond))
}

// netNew is rootRunner.command's network for a network namespace of its own, whose loopback
// interface has netAddr as well as 127.0.0.1.
const (
	netNew  = "new"
	netAddr = "192.0.2.1"
)

// rootRunner runs commands chrooted into root with env (the image's) as the processes of a
// container whose filesystem is root: in new mount, PID and IPC namespaces, with /proc, a tmpfs
// at /dev/shm and the host's /dev/null, /dev/zero and /dev/urandom bound onto the root's empty
// files. The mounts are private to the namespaces and go when their last process ends; the
// namespaces' processes are killed when the test's thread that started them ends.
type rootRunner struct {
	sh, mount, chroot, ip, nsenter string // the host's programs
	root                           string
	env                            []string
}

// command is args run in the root with env added to the image's. net is the network namespace:
// "" the test's, netNew a new one, or another process's /proc/PID/ns/net, which it joins.
func (r *rootRunner) command(ctx context.Context, net string, env []string, args ...string) *exec.Cmd {
	const script = `set -e
mount=$1 chroot=$2 ip=$3 net=$4 r=$5
shift 5
if [ "$net" = new ]; then
	"$ip" link set lo up
	"$ip" addr add ` + netAddr + `/32 dev lo
fi
"$mount" --make-rprivate /
"$mount" -t proc proc "$r/proc"
"$mount" -t tmpfs -o mode=1777,size=256m shm "$r/dev/shm"
for d in null zero urandom; do "$mount" --bind "/dev/$d" "$r/dev/$d"; done
exec "$chroot" "$r" "$@"`
	argv := append([]string{r.sh, "-c", script, "sh", r.mount, r.chroot, r.ip, net, r.root}, args...)
	flags := syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWIPC
	switch net {
	case "":
	case netNew:
		flags |= syscall.CLONE_NEWNET
	default:
		argv = append([]string{r.nsenter, "--net=" + net, "--"}, argv...)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(slices.Clone(r.env), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: uintptr(flags), Pdeathsig: syscall.SIGKILL}
	return cmd
}

// container is the image's entrypoint running in the root, its output in logPath.
type container struct {
	r         *rootRunner
	cmd       *exec.Cmd
	net       string   // the network namespace its clients use (rootRunner.command)
	clientEnv []string // how clients connect to it (PGHOST, PGPORT, PGUSER)
	logPath   string
	started   time.Time
	exited    chan error
	stopped   bool
	err       error // how it exited, once stopped
}

// startContainer starts args with env in network net (rootRunner.command), and stops it when t
// ends.
func startContainer(t *testing.T, r *rootRunner, net string, env []string, args ...string) *container {
	t.Helper()
	c := &container{r: r, net: net, logPath: filepath.Join(t.TempDir(), "container.log"), exited: make(chan error, 1)}
	logFile, err := os.Create(c.logPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logFile.Close() })
	c.cmd = r.command(context.Background(), net, env, args...)
	c.cmd.Stdout, c.cmd.Stderr = logFile, logFile
	c.started = time.Now()
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if net == netNew {
		c.net = fmt.Sprintf("/proc/%d/ns/net", c.cmd.Process.Pid)
	}
	go func() { c.exited <- c.cmd.Wait() }()
	t.Cleanup(func() {
		c.stop()
		if t.Failed() || testing.Verbose() {
			b, _ := os.ReadFile(c.logPath)
			t.Logf("the container's output:\n%s", b)
		}
	})
	return c
}

// stop ends the container as a runtime does with the image's stop signal, SIGINT (PostgreSQL's
// fast shutdown), then SIGKILL after 30 s; killing the namespaces' first process kills the
// others, and the namespaces' mounts go with them. It returns how the container exited.
func (c *container) stop() error {
	if c.stopped {
		return c.err
	}
	c.stopped = true
	c.cmd.Process.Signal(syscall.SIGINT)
	select {
	case c.err = <-c.exited:
	case <-time.After(30 * time.Second):
		c.cmd.Process.Kill()
		c.err = fmt.Errorf("no exit 30 s after SIGINT (killed): %v", <-c.exited)
	}
	return c.err
}

// client runs args in the root, in the container's network, with clientEnv and env, and returns
// their output.
func (c *container) client(env []string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return c.r.command(ctx, c.net, append(slices.Clone(c.clientEnv), env...), args...).CombinedOutput()
}

// waitReady polls the image's pg_isready for 60 s at most until the server accepts connections
// to db over TCP (the entrypoint's init phase listens on no TCP port).
func (c *container) waitReady(t *testing.T, db string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, err := c.client(nil, "pg_isready", "-q", "-d", db)
		if err == nil {
			break
		}
		select {
		case err := <-c.exited:
			c.stopped, c.err = true, err
			t.Fatalf("the container exited before accepting connections: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("pg_isready: not accepting connections 60 s after the container started: %v", err)
		}
	}
	t.Logf("accepting connections %v after the container started", time.Since(c.started).Round(time.Millisecond))
}

// unpack writes img's layer into root: directories, files and symlinks with their modes and
// owners, as a container runtime unpacks it.
func unpack(t *testing.T, img v1.Image, root string) {
	t.Helper()
	rc := onlyLayer(t, img)
	defer rc.Close()
	type dirMode struct {
		path string
		hdr  *tar.Header
	}
	var dirs []dirMode
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, hdr.Name)
		if !strings.HasPrefix(p, root+"/") {
			t.Fatalf("layer entry %q is outside the root", hdr.Name)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			dirs = append(dirs, dirMode{p, hdr})
			continue
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatal(err)
			}
		case tar.TypeSymlink:
			if err := os.Symlink(hdr.Linkname, p); err != nil {
				t.Fatal(err)
			}
			if err := os.Lchown(p, hdr.Uid, hdr.Gid); err != nil {
				t.Fatal(err)
			}
			continue
		default:
			t.Fatalf("layer entry %s of type %q", hdr.Name, hdr.Typeflag)
		}
		setOwnerMode(t, p, hdr)
	}
	// Directories last: a mode could keep their entries from being written.
	for _, d := range dirs {
		setOwnerMode(t, d.path, d.hdr)
	}
}

// setOwnerMode gives p hdr's owner, then its mode (chown clears the set-id bits).
func setOwnerMode(t *testing.T, p string, hdr *tar.Header) {
	t.Helper()
	if err := os.Lchown(p, hdr.Uid, hdr.Gid); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Chmod(p, uint32(hdr.Mode&0o7777)); err != nil {
		t.Fatal(err)
	}
}

// freePort is a TCP port on 127.0.0.1 that nothing listened on a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
