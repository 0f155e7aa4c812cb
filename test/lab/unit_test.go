package lab

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"kipper.run/kip/test/need"
)

func TestParseSources(t *testing.T) {
	deb822 := `Types: deb deb-src
# a comment
URIs: http://mirror.invalid/debian/
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://mirror.invalid/debian-security
Suites: bookworm-security
Components: main
Enabled: no

Types: deb-src
URIs: http://src.invalid/debian
Suites: bookworm

Types: deb
URIs:
 http://a.invalid/debian
 http://b.invalid/debian
Suites: trixie
`
	want := []aptSource{
		{URI: "http://mirror.invalid/debian", Suites: []string{"bookworm", "bookworm-updates"}},
		{URI: "http://a.invalid/debian", Suites: []string{"trixie"}},
		{URI: "http://b.invalid/debian", Suites: []string{"trixie"}},
	}
	if got := parseDeb822(deb822); !reflect.DeepEqual(got, want) {
		t.Errorf("deb822:\n got %+v\nwant %+v", got, want)
	}

	list := `# deb http://commented.invalid/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] http://mirror.invalid/debian bookworm main
deb-src http://src.invalid/debian bookworm main
deb [ trusted=yes ] http://sec.invalid/debian-security/ bookworm-security main # trailing
deb http://broken.invalid/debian
`
	want = []aptSource{
		{URI: "http://mirror.invalid/debian", Suites: []string{"bookworm"}},
		{URI: "http://sec.invalid/debian-security", Suites: []string{"bookworm-security"}},
	}
	if got := parseSourcesList(list); !reflect.DeepEqual(got, want) {
		t.Errorf("sources.list:\n got %+v\nwant %+v", got, want)
	}
}

func TestPickMirrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		srcs    []aptSource
		want    mirrors
		wantErr string
	}{
		{
			name: "archive and security",
			srcs: []aptSource{
				{URI: "http://s.invalid/debian-security", Suites: []string{"bookworm-security"}},
				{URI: "http://m.invalid/debian", Suites: []string{"bookworm-updates", "bookworm"}},
			},
			want: mirrors{Archive: "http://m.invalid/debian", Security: "http://s.invalid/debian-security"},
		},
		{
			name: "old security suite form is no archive",
			srcs: []aptSource{{URI: "http://s.invalid/debian-security", Suites: []string{"buster/updates"}}},
			want: mirrors{}, wantErr: "no Debian archive",
		},
		{
			name:    "https",
			srcs:    []aptSource{{URI: "https://m.invalid/debian", Suites: []string{"bookworm"}}},
			wantErr: "not plain HTTP",
		},
		{name: "none", wantErr: "no Debian archive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := pickMirrors(tc.srcs)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// TestMachineMirrors reads this machine's sources, where it has any.
func TestMachineMirrors(t *testing.T) {
	if _, err := os.Stat(sourcesDir); err != nil {
		need.Missing(t, "no apt sources on this machine (%s): the lab takes its Debian mirror from them", sourcesDir)
	}
	m, err := machineMirrors()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(m.Archive, "http://") {
		t.Errorf("archive %q", m.Archive)
	}
}

func TestMeminfo(t *testing.T) {
	for _, mib := range []int{4096, 8192} {
		mi, err := meminfo(mib)
		if err != nil {
			t.Fatal(err)
		}
		values := map[string]int{}
		for line := range strings.Lines(mi) {
			if m := regexp.MustCompile(`^(\w+):\s+(\d+) kB$`).FindStringSubmatch(strings.TrimSpace(line)); m != nil {
				values[m[1]], _ = strconv.Atoi(m[2])
			}
		}
		total := mib * 1024
		if values["MemTotal"] != total || values["MemFree"] > total || values["MemAvailable"] > total || values["MemAvailable"] == 0 {
			t.Errorf("%d MiB: %v", mib, values)
		}
		if !strings.Contains(mi, "SwapTotal:") {
			t.Errorf("%d MiB: the other fields are missing:\n%s", mib, mi)
		}
	}
}

func TestImageName(t *testing.T) {
	if !regexp.MustCompile(`^image-[0-9a-f]{16}$`).MatchString(imageName()) {
		t.Errorf("image name %q", imageName())
	}
	t.Setenv("KIP_CACHE_DIR", "/tmp/kip-cache")
	tarball, dir := imagePaths()
	if tarball != dir+".tar.zst" || !strings.HasPrefix(dir, "/tmp/kip-cache/lab/image-") {
		t.Errorf("paths %s %s", tarball, dir)
	}
}

// TestScripts checks the embedded scripts' syntax, and lints them where shellcheck is installed.
func TestScripts(t *testing.T) {
	for name, script := range map[string]string{"image.sh": imageScript, "boot.sh": bootScript} {
		if !strings.Contains(script, "\nset -eu\n") {
			t.Errorf("%s does not set -eu", name)
		}
		if out, err := exec.Command("sh", "-n", "-c", script).CombinedOutput(); err != nil {
			t.Errorf("sh -n %s: %v: %s", name, err, out)
		}
		if _, err := exec.LookPath("shellcheck"); err == nil {
			if out, err := exec.Command("shellcheck", "-s", "sh", name).CombinedOutput(); err != nil {
				t.Errorf("shellcheck %s: %s", name, out)
			}
		}
	}
}

// TestModprobeShim runs the modprobe a host with Modules gets, with a stand-in for the real
// modprobe that exits 3: the shim answers for its modules and hands anything else over.
func TestModprobeShim(t *testing.T) {
	dir := t.TempDir()
	standIn := filepath.Join(dir, "real-modprobe")
	must(t, os.WriteFile(standIn, []byte("#!/bin/sh\nexit 3\n"), 0o755))
	shim := filepath.Join(dir, "modprobe")
	script := modprobeShim([]string{"wireguard", "iscsi_tcp"})
	if strings.Count(script, "/usr/sbin/modprobe") != 3 {
		t.Fatalf("the shim does not hand over to /usr/sbin/modprobe:\n%s", script)
	}
	must(t, os.WriteFile(shim, []byte(strings.ReplaceAll(script, "/usr/sbin/modprobe", standIn)), 0o755))
	if out, err := exec.Command("sh", "-n", shim).CombinedOutput(); err != nil {
		t.Fatalf("sh -n: %v: %s", err, out)
	}
	if _, err := exec.LookPath("shellcheck"); err == nil {
		if out, err := exec.Command("shellcheck", shim).CombinedOutput(); err != nil {
			t.Errorf("shellcheck: %s", out)
		}
	}
	for _, tc := range []struct {
		args string
		exit int // 3: handed to the real modprobe
	}{
		{"-n -q wireguard", 0},
		{"wireguard", 0},
		{"-q iscsi-tcp", 0},
		{"-n -q nosuchmodule", 3},
		{"-n -q wireguard iscsi_tcp", 3}, // two names
		{"--show-depends wireguard", 3},  // any other option
		{"-n", 3},
	} {
		err := exec.Command(shim, strings.Fields(tc.args)...).Run()
		exit := 0
		if e, ok := err.(*exec.ExitError); ok {
			exit = e.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if exit != tc.exit {
			t.Errorf("modprobe %s: exit %d, want %d", tc.args, exit, tc.exit)
		}
	}
}

// TestLoopsBacking finds the loop devices bound to a file in a stand-in for /sys/block: deleted
// or not, and not those bound to another file or unbound.
func TestLoopsBacking(t *testing.T) {
	sys := t.TempDir()
	for dev, backing := range map[string]string{
		"loop0": "/var/lib/kip-lab/lab1/longhorn.img\n",
		"loop1": "/var/lib/kip-lab/lab2/longhorn.img\n",
		"loop2": "/var/lib/kip-lab/lab1/longhorn.img (deleted)\n",
		"loop3": "/var/lib/kip-lab/lab1/longhorn.img.old\n",
		"loop4": "", // unbound: no loop directory
		"vda":   "/var/lib/kip-lab/lab1/longhorn.img\n",
	} {
		dir := filepath.Join(sys, dev)
		if backing != "" {
			dir = filepath.Join(dir, "loop")
		}
		must(t, os.MkdirAll(dir, 0o755))
		if backing != "" {
			must(t, os.WriteFile(filepath.Join(dir, "backing_file"), []byte(backing), 0o644))
		}
	}
	got := loopsBacking(sys, "/var/lib/kip-lab/lab1/longhorn.img")
	if want := []string{"loop0", "loop2"}; !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := loopsBacking(sys, "/nowhere"); got != nil {
		t.Errorf("for an unbound file: %q", got)
	}
}

// TestHostCgroups: a host gets a cgroup of its own below the caller's in every hierarchy this
// machine mounts (cgroup v1 controllers, name=systemd, the unified one), as measured here.
func TestHostCgroups(t *testing.T) {
	self := "9:name=systemd:/\n8:pids:/\n5:devices:/\n4:memory:/sandbox/abc\n3:cpuset:/\n2:cpu,cpuacct:/\n0::/\n"
	mounts := `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`
	got, err := hostCgroups("lab1", self, mounts)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"/sys/fs/cgroup/systemd/kip-lab1", "/sys/fs/cgroup/pids/kip-lab1", "/sys/fs/cgroup/devices/kip-lab1",
		"/sys/fs/cgroup/memory/sandbox/abc/kip-lab1", "/sys/fs/cgroup/cpuset/kip-lab1",
		"/sys/fs/cgroup/cpu,cpuacct/kip-lab1", "/sys/fs/cgroup/unified/kip-lab1",
	}
	if !slices.Equal(got, want) {
		t.Errorf("host cgroups:\n got %q\nwant %q", got, want)
	}
	if _, err := hostCgroups("lab1", "4:memory:/\n", "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"); err == nil {
		t.Error("no systemd or unified hierarchy: no error")
	}
}
