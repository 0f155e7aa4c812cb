package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"kipper.run/kip/test/need"
)

const testBusybox = "/bin/busybox"

// buildPause builds the pause program, statically, into dir and returns its path.
func buildPause(t *testing.T, dir string) string {
	t.Helper()
	goCmd := need.Command(t, "go", "install Go")
	out := filepath.Join(dir, "pause")
	cmd := exec.Command(goCmd, "build", "-o", out, "./pause")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./pause: %v\n%s", err, b)
	}
	return out
}

// binDir holds the pause binary and copies of it standing in for coredns and
// local-path-provisioner.
func binDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	pause, err := os.ReadFile(buildPause(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"coredns", "local-path-provisioner"} {
		if err := os.WriteFile(filepath.Join(dir, n), pause, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func needBusybox(t *testing.T) {
	t.Helper()
	if err := checkStaticBusybox(testBusybox); err != nil {
		need.Missing(t, "%v", err)
	}
}

// layerEntry is what the test checks of a layer's tar entry.
type layerEntry struct {
	typ      byte
	mode     int64
	uid, gid int
	linkname string
	data     []byte
}

// onlyLayer opens the uncompressed contents of img's one layer.
func onlyLayer(t *testing.T, img v1.Image) io.ReadCloser {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

func readLayer(t *testing.T, img v1.Image) map[string]layerEntry {
	t.Helper()
	rc := onlyLayer(t, img)
	defer rc.Close()
	entries := map[string]layerEntry{}
	var names []string
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hdr.Name)
		entries[hdr.Name] = layerEntry{typ: hdr.Typeflag, mode: hdr.Mode, uid: hdr.Uid, gid: hdr.Gid, linkname: hdr.Linkname, data: data}
		if hdr.Uid != 0 || hdr.Gid != 0 {
			t.Errorf("%s owned by %d:%d, want 0:0", hdr.Name, hdr.Uid, hdr.Gid)
		}
		if !hdr.ModTime.Equal(epoch) {
			t.Errorf("%s mtime %v, want %v", hdr.Name, hdr.ModTime, epoch)
		}
	}
	if !slices.IsSorted(names) {
		t.Errorf("layer entries not sorted: %v", names)
	}
	return entries
}

func wantEntry(t *testing.T, entries map[string]layerEntry, p string, typ byte, mode int64) layerEntry {
	t.Helper()
	e, ok := entries[p]
	if !ok {
		t.Errorf("layer has no %s", p)
		return e
	}
	if e.typ != typ || e.mode&0o7777 != mode {
		t.Errorf("%s: type %q mode %o, want type %q mode %o", p, e.typ, e.mode, typ, mode)
	}
	return e
}

func TestBuild(t *testing.T) {
	needBusybox(t)
	bin := binDir(t)
	pause, err := os.ReadFile(filepath.Join(bin, "pause"))
	if err != nil {
		t.Fatal(err)
	}
	busybox, err := os.ReadFile(testBusybox)
	if err != nil {
		t.Fatal(err)
	}
	out1, out2 := t.TempDir(), t.TempDir()
	if err := build(setTestenv, bin, testBusybox, out1); err != nil {
		t.Fatal(err)
	}
	if err := build(setTestenv, bin, testBusybox, out2); err != nil {
		t.Fatal(err)
	}

	for _, im := range imagesOf(setTestenv) {
		t.Run(im.file, func(t *testing.T) {
			p := filepath.Join(out1, im.file)
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o644 {
				t.Errorf("%s mode %v, want 0644", p, fi.Mode().Perm())
			}
			t.Logf("%s: %d bytes", im.file, fi.Size())
			tag, err := name.NewTag(im.ref)
			if err != nil {
				t.Fatal(err)
			}
			img, err := tarball.ImageFromPath(p, &tag)
			if err != nil {
				t.Fatalf("%s does not hold %s: %v", p, im.ref, err)
			}
			m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(p) })
			if err != nil {
				t.Fatal(err)
			}
			if len(m) != 1 || !slices.Equal(m[0].RepoTags, []string{im.ref}) {
				t.Errorf("manifest.json: %+v, want one image tagged %s", m, im.ref)
			}

			cfg, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cfg.OS != "linux" || cfg.Architecture != runtime.GOARCH {
				t.Errorf("platform %s/%s, want linux/%s", cfg.OS, cfg.Architecture, runtime.GOARCH)
			}
			if !cfg.Created.Equal(epoch) {
				t.Errorf("created %v, want %v", cfg.Created, epoch)
			}
			if !slices.Equal(cfg.Config.Entrypoint, im.entrypoint) || !slices.Equal(cfg.Config.Cmd, im.cmd) || !slices.Equal(cfg.Config.Env, im.env) {
				t.Errorf("entrypoint %q cmd %q env %q, want %q %q %q", cfg.Config.Entrypoint, cfg.Config.Cmd, cfg.Config.Env, im.entrypoint, im.cmd, im.env)
			}
			if len(cfg.RootFS.DiffIDs) != 1 || len(cfg.History) != 1 {
				t.Errorf("rootfs %d diff ids, %d history entries, want 1 and 1", len(cfg.RootFS.DiffIDs), len(cfg.History))
			}

			entries := readLayer(t, img)
			wantEntry(t, entries, "etc/", tar.TypeDir, 0o755)
			wantEntry(t, entries, "tmp/", tar.TypeDir, 0o1777)
			if e := wantEntry(t, entries, "etc/passwd", tar.TypeReg, 0o644); !strings.Contains(string(e.data), "root:x:0:0:root:/root:/bin/sh\n") || !strings.Contains(string(e.data), "nobody:x:65534:65534:") {
				t.Errorf("etc/passwd: %q", e.data)
			}
			if e := wantEntry(t, entries, "etc/group", tar.TypeReg, 0o644); string(e.data) != "root:x:0:\nnogroup:x:65534:\n" {
				t.Errorf("etc/group: %q", e.data)
			}
			for _, b := range im.bins {
				e := wantEntry(t, entries, strings.TrimPrefix(b.path, "/"), tar.TypeReg, 0o755)
				if !bytes.Equal(e.data, pause) {
					t.Errorf("%s is not the -bin %s", b.path, b.bin)
				}
			}
			for f, content := range im.files {
				if e := wantEntry(t, entries, strings.TrimPrefix(f, "/"), tar.TypeReg, 0o644); string(e.data) != content {
					t.Errorf("%s: %q, want %q", f, e.data, content)
				}
			}
			if im.file == "local-path-provisioner.tar" {
				wantEntry(t, entries, "usr/", tar.TypeDir, 0o755)
				wantEntry(t, entries, "usr/bin/", tar.TypeDir, 0o755)
			}
			if im.busybox {
				wantEntry(t, entries, "bin/", tar.TypeDir, 0o755)
				if e := wantEntry(t, entries, "bin/busybox", tar.TypeReg, 0o755); !bytes.Equal(e.data, busybox) {
					t.Errorf("bin/busybox is not %s", testBusybox)
				}
				for _, a := range []string{"sh", "nslookup", "wget", "ls", "cat"} {
					if e := wantEntry(t, entries, "bin/"+a, tar.TypeSymlink, 0o777); e.linkname != "busybox" {
						t.Errorf("bin/%s -> %q, want busybox", a, e.linkname)
					}
				}
			}

			d1, err := img.Digest()
			if err != nil {
				t.Fatal(err)
			}
			img2, err := tarball.ImageFromPath(filepath.Join(out2, im.file), &tag)
			if err != nil {
				t.Fatal(err)
			}
			d2, err := img2.Digest()
			if err != nil {
				t.Fatal(err)
			}
			if d1 != d2 {
				t.Errorf("two builds gave digests %s and %s", d1, d2)
			}
			a1, _ := os.ReadFile(p)
			a2, _ := os.ReadFile(filepath.Join(out2, im.file))
			if !bytes.Equal(a1, a2) {
				t.Errorf("two builds gave different archives")
			}
		})
	}

	leftovers, _ := filepath.Glob(filepath.Join(out1, ".*"))
	if len(leftovers) > 0 {
		t.Errorf("temporary files left in -out: %v", leftovers)
	}
}

func TestBuildMissingBinary(t *testing.T) {
	needBusybox(t)
	err := build(setTestenv, t.TempDir(), testBusybox, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "coredns") || !strings.Contains(err.Error(), "make testenv") {
		t.Fatalf("build with an empty -bin: %v, want an error naming coredns and make testenv", err)
	}
}

func TestBuildRefusesDynamicBusybox(t *testing.T) {
	// The test binary itself is dynamically linked when cgo is on; a Go binary built with
	// CGO_ENABLED=0 is static. Use any dynamically linked system binary.
	var dyn string
	for _, p := range []string{"/bin/sh", "/usr/bin/env", "/bin/ls"} {
		if checkStaticBusybox(p) != nil {
			if _, err := os.Stat(p); err == nil {
				dyn = p
				break
			}
		}
	}
	if dyn == "" {
		need.Missing(t, "no dynamically linked binary (/bin/sh, /usr/bin/env, /bin/ls) to offer as busybox")
	}
	err := checkStaticBusybox(dyn)
	if err == nil || !strings.Contains(err.Error(), "apt-get install busybox-static") {
		t.Fatalf("checkStaticBusybox(%s): %v, want a refusal naming busybox-static", dyn, err)
	}
}

func TestPause(t *testing.T) {
	pause := buildPause(t, t.TempDir())
	sh := need.Command(t, "sh", "a POSIX shell")

	out, err := exec.Command(pause, "-v").Output()
	if err != nil || !strings.Contains(string(out), "pause") {
		t.Errorf("pause -v: %q, %v", out, err)
	}

	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			// The deadline only bounds a failure; it asserts no timing.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// pause starts with SIGINT and SIGTERM ignored (a shell's trap "" survives exec),
			// so a signal sent before its handler is installed is dropped rather than killing
			// it: the test sends the signal until pause exits, and pause must exit 0.
			cmd := exec.CommandContext(ctx, sh, "-c", `trap "" INT TERM; exec "$0"`, pause)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case err := <-done:
					if err != nil {
						t.Fatalf("pause after %v: %v (ctx %v), want exit status 0", sig, err, ctx.Err())
					}
					return
				case <-tick.C:
					if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
						t.Fatal(err)
					}
				}
			}
		})
	}
}

// TestPauseReaps gives pause a child (the shell forks it, then execs pause) and waits for the
// child's zombie to be reaped.
func TestPauseReaps(t *testing.T) {
	pause := buildPause(t, t.TempDir())
	sh := need.Command(t, "sh", "a POSIX shell")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, sh, "-c", `sleep 0.2 & echo $!; exec "$0"`, pause)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	child := strings.TrimSpace(line)
	for {
		if _, err := os.Stat("/proc/" + child); errors.Is(err, os.ErrNotExist) {
			return
		}
		if ctx.Err() != nil {
			stat, _ := os.ReadFile("/proc/" + child + "/stat")
			t.Fatalf("pause's child %s was never reaped: %s", child, stat)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
