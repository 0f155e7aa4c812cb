package k3s

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
)

// BinaryPath is where k3s's installer puts the binary, and kip too.
const BinaryPath = "/usr/local/bin/k3s"

// release names the assets of one architecture in a k3s release (and an airgap bundle):
// the binary and the sha256sum file that lists it.
type release struct{ binary, checksums string }

// releases maps `uname -m` to k3s's asset names.
var releases = map[string]release{
	"x86_64":  {"k3s", "sha256sum-amd64.txt"},
	"amd64":   {"k3s", "sha256sum-amd64.txt"},
	"aarch64": {"k3s-arm64", "sha256sum-arm64.txt"},
	"arm64":   {"k3s-arm64", "sha256sum-arm64.txt"},
	"armv7l":  {"k3s-armhf", "sha256sum-arm.txt"},
}

func assets(arch string) (release, error) {
	r, ok := releases[arch]
	if !ok {
		return release{}, fmt.Errorf("k3s has no release for the %s architecture: kip supports x86_64, aarch64 and armv7l hosts", arch)
	}
	return r, nil
}

// Binary is a k3s binary whose checksum kip verified against the release's own checksum file.
type Binary struct {
	Data   []byte
	SHA256 string
	Source string // where it came from, for messages
}

// CheckBundleDir refuses an --airgap-bundle that is not a directory, before a command connects
// anywhere.
func CheckBundleDir(dir string) error {
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return fmt.Errorf("--airgap-bundle %s: not a directory (it holds the k3s release's binary and its sha256sum file)", dir)
	}
	return nil
}

// LoadBundle reads the k3s binary for arch from an airgap bundle directory (the release's assets,
// e.g. k3s and sha256sum-amd64.txt) and verifies it against the bundle's checksum file. kip
// never installs a binary whose checksum it could not verify.
func LoadBundle(dir, arch string) (*Binary, error) {
	r, err := assets(arch)
	if err != nil {
		return nil, err
	}
	binPath, sumPath := filepath.Join(dir, r.binary), filepath.Join(dir, r.checksums)
	sums, err := os.ReadFile(sumPath)
	if err != nil {
		return nil, fmt.Errorf("airgap bundle %s: %w (it needs the release's %s and %s)", dir, err, r.binary, r.checksums)
	}
	want, err := ChecksumFor(sums, r.binary)
	if err != nil {
		return nil, fmt.Errorf("airgap bundle %s: %s: %w", dir, r.checksums, err)
	}
	data, err := os.ReadFile(binPath)
	if err != nil {
		return nil, fmt.Errorf("airgap bundle %s: %w", dir, err)
	}
	sum := sha256.Sum256(data)
	got := hex.EncodeToString(sum[:])
	if got != want {
		return nil, fmt.Errorf("airgap bundle %s: %s has SHA-256 %s, but %s says %s: the bundle is damaged or was altered; download the release's assets again",
			dir, r.binary, got, r.checksums, want)
	}
	return &Binary{Data: data, SHA256: got, Source: binPath}, nil
}

// ChecksumFor returns the SHA-256 that a sha256sum-format file lists for name.
func ChecksumFor(sums []byte, name string) (string, error) {
	sc := bufio.NewScanner(bytes.NewReader(sums))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 2 {
			continue
		}
		file := strings.TrimPrefix(fields[1], "*") // sha256sum's binary-mode marker
		if file != name {
			continue
		}
		sum := strings.ToLower(fields[0])
		if b, err := hex.DecodeString(sum); err != nil || len(b) != sha256.Size {
			return "", fmt.Errorf("the checksum listed for %s is not a SHA-256: %q", name, fields[0])
		}
		return sum, nil
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", errors.New("it lists no checksum for " + name)
}

// releaseBase is where k3s's releases publish their assets.
const releaseBase = "https://github.com/k3s-io/k3s/releases/download/"

// Release is where a k3s release publishes its binary for one architecture, and the checksum
// file that vouches for it.
type Release struct {
	Binary       string // the binary's asset name, as the checksum file lists it
	BinaryURL    string
	ChecksumsURL string
}

// ReleaseFor returns the assets of k3s version for arch (`uname -m`).
func ReleaseFor(version, arch string) (Release, error) {
	r, err := assets(arch)
	if err != nil {
		return Release{}, err
	}
	base := releaseBase + url.PathEscape(version) + "/"
	return Release{Binary: r.binary, BinaryURL: base + r.binary, ChecksumsURL: base + r.checksums}, nil
}
