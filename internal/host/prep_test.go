package host

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"kipper.run/kip/internal/sshx"
)

func TestModules(t *testing.T) {
	for _, tc := range []struct {
		longhorn, wireGuard bool
		want                string
	}{
		{false, false, "br_netfilter overlay"},
		{false, true, "br_netfilter overlay wireguard"},
		{true, false, "br_netfilter overlay iscsi_tcp nfs"},
		{true, true, "br_netfilter overlay wireguard iscsi_tcp nfs"},
	} {
		if got := strings.Join(Modules(tc.longhorn, tc.wireGuard), " "); got != tc.want {
			t.Errorf("Modules(%v, %v) = %q, want %q", tc.longhorn, tc.wireGuard, got, tc.want)
		}
	}
	if got := modulesContent([]string{"br_netfilter", "overlay"}); !strings.HasSuffix(got, "\nbr_netfilter\noverlay\n") || !strings.HasPrefix(got, "# ") {
		t.Errorf("modules file:\n%s", got)
	}
}

// runPrep runs prep.sh on this machine, without SSH, and returns its sections.
func runPrep(t *testing.T, args ...string) map[string]string {
	t.Helper()
	out, err := exec.Command("sh", append([]string{"-c", prepScript, "kip-prep"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("prep.sh %q: %v: %s", args, err, out)
	}
	if !strings.Contains(string(out), "\n@@kip-prep ") {
		return map[string]string{}
	}
	s, err := sshx.Sections(string(out), "@@kip-prep", nil)
	if err != nil {
		t.Fatalf("%v in:\n%s", err, out)
	}
	return s
}

// TestPrepScriptLocally runs what of prep.sh can run on this machine without changing it: show,
// and writing files (modules with no module to load) into a temporary directory.
func TestPrepScriptLocally(t *testing.T) {
	dir := t.TempDir()
	a, b, none := filepath.Join(dir, "a.conf"), filepath.Join(dir, "b.conf"), filepath.Join(dir, "none.conf")
	if err := os.WriteFile(a, []byte("x\n\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b, []byte("y"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := runPrep(t, "show", a, b, none, "--", "kernel.ostype", "no.such.key")
	want := map[string]string{"file " + a: "x\n\n", "file " + b: "y", "sysctl kernel.ostype": "", "sysctl no.such.key": "missing\n"}
	access, value, _ := strings.Cut(s["sysctl kernel.ostype"], " ")
	if (access != "readonly" && access != "writable") || value != "Linux\n" {
		t.Errorf("kernel.ostype: %q", s["sysctl kernel.ostype"])
	}
	s["sysctl kernel.ostype"] = ""
	if !reflect.DeepEqual(s, want) {
		t.Errorf("got %q\nwant %q", s, want)
	}

	// Files are written whole, once; a file that holds its content already is left alone.
	conf := filepath.Join(dir, "sub", "kipper.conf")
	content := modulesContent(nil)
	s = runPrep(t, "modules", conf, content)
	if got, err := os.ReadFile(conf); err != nil || string(got) != content || strings.TrimSpace(s["kernel"]) == "" {
		t.Fatalf("modules wrote %q, %v; sections %q", got, err, s)
	}
	before, err := os.Stat(conf)
	if err != nil {
		t.Fatal(err)
	}
	runPrep(t, "modules", conf, content)
	if after, err := os.Stat(conf); err != nil || !os.SameFile(before, after) {
		t.Errorf("an unchanged file was written again: %v", err)
	}
	runPrep(t, "modules", conf, "other\n")
	if got, _ := os.ReadFile(conf); string(got) != "other\n" {
		t.Errorf("a changed file was not written: %q", got)
	}
	if ents, _ := os.ReadDir(filepath.Dir(conf)); len(ents) != 1 {
		t.Errorf("temporary files left: %v", ents)
	}
}

func TestLoadError(t *testing.T) {
	mods := Modules(true, true)
	ubuntu := sshx.OS{ID: "ubuntu", VersionID: "24.04"}
	if err := loadError("h", ubuntu, mods, map[string]string{"kernel": "6.1.0-28-amd64\n"}); err != nil {
		t.Fatal(err)
	}
	err := loadError("h", ubuntu, mods, map[string]string{
		"kernel":           "6.1.0-28-amd64\n",
		"failed wireguard": "modprobe: FATAL: Module wireguard not found in directory /lib/modules/6.1.0-28-amd64\n",
		"failed iscsi_tcp": "modprobe: FATAL: Module iscsi_tcp not found\n",
		"failed nfs":       "modprobe: FATAL: Module nfs not found\n",
	})
	want := "load kernel modules on h: 3 cannot load: " +
		"wireguard (modprobe: FATAL: Module wireguard not found in directory /lib/modules/6.1.0-28-amd64), " +
		"iscsi_tcp (modprobe: FATAL: Module iscsi_tcp not found), nfs (modprobe: FATAL: Module nfs not found); " +
		"fix: boot a kernel with the wireguard module (Linux 5.6 or later has it); " +
		"install the kernel modules package for kernel 6.1.0-28-amd64 (apt-get install linux-modules-extra-6.1.0-28-amd64), or boot a kernel that has iscsi_tcp; " +
		"install the kernel modules package for kernel 6.1.0-28-amd64 (apt-get install linux-modules-extra-6.1.0-28-amd64), or boot a kernel that has nfs"
	if err == nil || err.Error() != want {
		t.Errorf("got  %v\nwant %s", err, want)
	}
	// The fix is the host's own: dnf on the RHEL family, none to install on Debian.
	rocky := loadError("h", sshx.OS{ID: "rocky", VersionID: "9.6"}, []string{"nfs"}, map[string]string{"kernel": "5.14.0-570.el9.x86_64\n", "failed nfs": "not found\n"})
	if rocky == nil || !strings.Contains(rocky.Error(), "(dnf install kernel-modules-5.14.0-570.el9.x86_64)") || strings.Contains(rocky.Error(), "apt-get") {
		t.Errorf("rocky: %v", rocky)
	}
	debian := loadError("h", sshx.OS{ID: "debian", VersionID: "12"}, []string{"nfs"}, map[string]string{"kernel": "6.1.0-28-amd64\n", "failed nfs": "not found\n"})
	if debian == nil || !strings.Contains(debian.Error(), "boot a kernel that has the nfs module") {
		t.Errorf("debian: %v", debian)
	}
}

func TestSysctls(t *testing.T) {
	show := func(edit func(map[string]string)) map[string]string {
		s := map[string]string{"file " + sysctlFile: sysctlContent()}
		for _, c := range sysctls {
			s["sysctl "+c.key] = "writable " + c.value + "\n"
		}
		if edit != nil {
			edit(s)
		}
		return s
	}
	for _, tc := range []struct {
		name string
		edit func(map[string]string)
		want bool
	}{
		{"set", nil, true},
		{"no file", func(s map[string]string) { delete(s, "file "+sysctlFile) }, false},
		{"other file", func(s map[string]string) { s["file "+sysctlFile] += "vm.swappiness = 1\n" }, false},
		{"forwarding off", func(s map[string]string) { s["sysctl net.ipv4.ip_forward"] = "writable 0\n" }, false},
		{"more watches", func(s map[string]string) { s["sysctl fs.inotify.max_user_watches"] = "writable 2097152\n" }, true},
		{"fewer watches", func(s map[string]string) { s["sysctl fs.inotify.max_user_watches"] = "writable 8192\n" }, false},
		{"container", func(s map[string]string) { s["sysctl fs.inotify.max_user_instances"] = "readonly 128\n" }, true},
		{"no br_netfilter", func(s map[string]string) { s["sysctl net.bridge.bridge-nf-call-iptables"] = "missing\n" }, false},
		{"forwarding 2", func(s map[string]string) { s["sysctl net.ipv4.ip_forward"] = "writable 2\n" }, false},
	} {
		if got := sysctlsHold(show(tc.edit)); got != tc.want {
			t.Errorf("%s: in place %v, want %v", tc.name, got, tc.want)
		}
	}
	content := sysctlContent()
	for _, c := range sysctls {
		if !strings.Contains(content, "\n"+c.key+" = "+c.value+"\n") {
			t.Errorf("the file lacks %s:\n%s", c.key, content)
		}
	}
}

func TestHardeningFiles(t *testing.T) {
	var paths []string
	for _, f := range hardeningFiles(true) {
		paths = append(paths, f.service+" "+f.path)
		if !strings.HasSuffix(f.content, "\n") || strings.Contains(f.content, "sshd") {
			t.Errorf("%s:\n%s", f.path, f.content)
		}
	}
	if want := []string{"journald " + journaldFile, "multipath " + multipathFile}; !reflect.DeepEqual(paths, want) {
		t.Errorf("got %q, want %q", paths, want)
	}
	if len(hardeningFiles(false)) != 1 {
		t.Error("multipath's blacklist on a host without Longhorn")
	}
}
