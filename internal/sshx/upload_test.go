package sshx

import (
	"bytes"
	"context"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"kipper.run/kip/test/sshd"
)

func TestUpload(t *testing.T) {
	c, _, _ := startClient(t)
	ctx := context.Background()
	// The host is this machine: check the result directly.
	dir := filepath.Join(t.TempDir(), "it's a dir")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "conf $(id) file")
	data := []byte("line 1\n'single' \"double\" $(id) `id` \\ %s\n\x00\xff no final newline")

	if err := c.Upload(ctx, path, data, 0o640, sshd.NoSudoUser); err != nil {
		t.Fatal(err)
	}
	nosudo, err := user.Lookup(sshd.NoSudoUser)
	if err != nil {
		t.Fatal(err)
	}
	first := checkFile(t, path, data, 0o640, nosudo.Uid)

	// A second upload replaces the file with a new one (a rename, never a rewrite in place).
	data2 := []byte("v2\n")
	if err := c.Upload(ctx, path, data2, 0o600, ""); err != nil {
		t.Fatal(err)
	}
	if second := checkFile(t, path, data2, 0o600, "0"); second == first {
		t.Error("the file was rewritten in place, not replaced")
	}

	// A failing step leaves the file as it was and no temporary file behind.
	err = c.Upload(ctx, path, []byte("v3\n"), 0o644, "no-such-user-kip")
	if err == nil || !strings.Contains(err.Error(), "no-such-user-kip") {
		t.Fatalf("Upload with an unknown owner: %v", err)
	}
	checkFile(t, path, data2, 0o600, "0")
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("files left in %s: %v", dir, ents)
	}

	if err := c.Upload(ctx, "relative/path", data, 0o644, ""); err == nil || !strings.Contains(err.Error(), "must be absolute") {
		t.Errorf("Upload to a relative path: %v", err)
	}
}

// checkFile checks a file's content, mode and owner, and returns its inode.
func checkFile(t *testing.T, path string, data []byte, mode os.FileMode, uid string) uint64 {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Errorf("content %q, want %q", got, data)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode() != mode || strconv.Itoa(int(st.Uid)) != uid {
		t.Errorf("mode %v owner %d, want %v owner %s", fi.Mode(), st.Uid, mode, uid)
	}
	return st.Ino
}
