package k3s

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func bundle(t *testing.T, bin []byte, sums string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "k3s"), bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if sums != "" {
		if err := os.WriteFile(filepath.Join(dir, "sha256sum-amd64.txt"), []byte(sums), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func hexSum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func TestLoadBundle(t *testing.T) {
	bin := []byte("#!/bin/sh\necho k3s\n")
	good := hexSum(bin)
	other := hexSum([]byte("something else"))
	tests := []struct {
		name, sums, arch, err string
	}{
		{"verified", good + "  k3s-arm64\n" + good + "  k3s\n", "x86_64", ""},
		{"binary-mode marker", good + " *k3s\n", "amd64", ""},
		{"upper-case sum", strings.ToUpper(good) + "  k3s\n", "x86_64", ""},
		{"wrong checksum", other + "  k3s\n", "x86_64", "the bundle is damaged or was altered"},
		{"not listed", good + "  k3s-airgap-images-amd64.tar\n", "x86_64", "lists no checksum for k3s"},
		{"not a sha256", "abc  k3s\n", "x86_64", "is not a SHA-256"},
		{"no checksum file", "", "x86_64", "sha256sum-amd64.txt"},
		{"unknown arch", good + "  k3s\n", "riscv64", "no release for the riscv64 architecture"},
		{"arm64 binary missing", good + "  k3s\n", "aarch64", "sha256sum-arm64.txt"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := LoadBundle(bundle(t, bin, tt.sums), tt.arch)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("LoadBundle = %v, want error containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b.SHA256 != good || string(b.Data) != string(bin) {
				t.Fatalf("loaded %+v", b)
			}
		})
	}
}

func FuzzChecksumFor(f *testing.F) {
	f.Add([]byte("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855  k3s\n"), "k3s")
	f.Add([]byte("x *k3s\n\n  \n"), "k3s")
	f.Fuzz(func(t *testing.T, sums []byte, name string) {
		sum, err := ChecksumFor(sums, name)
		if err == nil {
			if b, derr := hex.DecodeString(sum); derr != nil || len(b) != sha256.Size || sum != strings.ToLower(sum) {
				t.Fatalf("ChecksumFor returned %q, not a lower-case SHA-256", sum)
			}
		}
	})
}
