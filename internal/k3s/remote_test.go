package k3s

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func TestParseVersion(t *testing.T) {
	for out, want := range map[string]string{
		"k3s version v1.37.2+k3s1 (abc123)\ngo version go1.26.8\n": "v1.37.2+k3s1",
		"":                               "",
		"bash: k3s: command not found\n": "",
		"k3s version\n":                  "",
	} {
		if got := ParseVersion(out); got != want {
			t.Errorf("ParseVersion(%q) = %q, want %q", out, got, want)
		}
	}
}

func TestCheckPinned(t *testing.T) {
	b := BinaryInstall{Version: "v1.37.2+k3s1", Pinned: "ABCD"}
	if err := b.CheckPinned("abcd"); err != nil {
		t.Errorf("the pinned checksum in another case: %v", err)
	}
	want := "the k3s v1.37.2+k3s1 binary has SHA-256 ef01, but this kip pins ABCD: refusing it"
	if err := b.CheckPinned("ef01"); err == nil || err.Error() != want {
		t.Errorf("another checksum: %v, want %q", err, want)
	}
	if err := (BinaryInstall{Version: "v1.36.1+k3s1"}).CheckPinned("ef01"); err != nil {
		t.Errorf("no pin: %v", err)
	}
}

func TestBackupAndRestoreFiles(t *testing.T) {
	dir := t.TempDir()
	existing, added := filepath.Join(dir, "config.yaml"), filepath.Join(dir, "kipper-authentication.yaml")
	if err := os.WriteFile(existing, []byte("old\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A backup left by an earlier run, of a file that does not exist now, must not come back.
	if err := os.WriteFile(added+".kipper-bak", []byte("stale\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	files := []string{existing, added}
	sh := func(cmd string) {
		t.Helper()
		if out, err := exec.Command("sh", "-c", cmd).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, out)
		}
	}
	sh(BackupCommand(files...))
	for _, f := range files { // kip writes its files
		if err := os.WriteFile(f, []byte("new\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	sh(RestoreCommand(files...))
	if b, err := os.ReadFile(existing); err != nil || string(b) != "old\n" {
		t.Errorf("config.yaml after the restore: %q %v", b, err)
	}
	if _, err := os.Stat(added); !os.IsNotExist(err) {
		t.Errorf("a file that did not exist before the change is still there after the restore: %v", err)
	}
	if b, err := os.ReadFile(existing + ".kipper-bak"); err != nil || string(b) != "old\n" {
		t.Errorf("backup: %q %v", b, err)
	}
}
