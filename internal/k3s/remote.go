package k3s

import (
	"context"
	"fmt"
	"strings"

	"kipper.run/kip/internal/sshx"
)

// ParseVersion reads the release from `k3s --version` ("k3s version v1.37.2+k3s1 (…)"), ""
// when the output is not that.
func ParseVersion(out string) string {
	if f := strings.Fields(out); len(f) >= 3 && f[0] == "k3s" && f[1] == "version" {
		return f[2]
	}
	return ""
}

// RemoteVersion is the k3s release the binary at path on the host reports, "" when there is
// none there or it does not answer like k3s.
func RemoteVersion(ctx context.Context, c *sshx.Client, path string) (string, error) {
	res, err := c.Probe(ctx, "if [ -x "+sshx.Quote(path)+" ]; then "+sshx.Command(path, "--version")+"; fi")
	if err != nil || res.ExitStatus != 0 {
		return "", err
	}
	return ParseVersion(string(res.Stdout)), nil
}

// BinaryInstall puts the k3s binary of one release at BinaryPath on a host (the server at
// install, a worker at kip node add), always verified: from an airgap bundle kip verified, or
// downloaded on the host and checked there against the release's checksum file.
type BinaryInstall struct {
	C       *sshx.Client
	Version string // the release to install, e.g. v1.37.2+k3s1
	Arch    string // the host's `uname -m`
	// Bundle is the binary from --airgap-bundle; nil downloads it on the host.
	Bundle *Binary
	// Pinned is the SHA-256 this kip pins for Version, "" when it pins none: a binary with
	// another checksum is refused.
	Pinned string
}

// CheckPinned refuses a binary whose checksum differs from the pinned one.
func (b BinaryInstall) CheckPinned(sum string) error {
	if b.Pinned != "" && !strings.EqualFold(b.Pinned, sum) {
		return fmt.Errorf("the k3s %s binary has SHA-256 %s, but this kip pins %s: refusing it", b.Version, sum, b.Pinned)
	}
	return nil
}

// Install installs the binary.
func (b BinaryInstall) Install(ctx context.Context) error {
	if b.Bundle != nil {
		return b.put(ctx, func(ctx context.Context, tmp string) error {
			return b.C.Upload(ctx, tmp, b.Bundle.Data, 0o755, "")
		})
	}
	return b.download(ctx)
}

// Plan says how Install gets the binary, for a dry run; source names the airgap bundle.
func (b BinaryInstall) Plan(source string) string {
	if b.Bundle != nil {
		return "upload " + BinaryPath + " from " + source + ", verified against the bundle's checksum file"
	}
	return "download k3s " + b.Version + " and its release checksum file on the host, verify, install at " + BinaryPath
}

// put puts a verified k3s binary in place: fetch writes it to a temporary path next to
// BinaryPath, kip checks that it is the release wanted, and only then renames it into place, so
// a wrong binary never replaces the running one.
func (b BinaryInstall) put(ctx context.Context, fetch func(ctx context.Context, tmp string) error) error {
	tmp := BinaryPath + ".kip-new"
	if err := fetch(ctx, tmp); err != nil {
		return err
	}
	got, err := RemoteVersion(ctx, b.C, tmp)
	if err != nil {
		return err
	}
	if got != b.Version {
		_, _ = b.C.Output(ctx, sshx.Command("rm", "-f", tmp))
		return fmt.Errorf("the k3s binary reports version %q, but this host needs %s: use the airgap bundle of k3s %s", got, b.Version, b.Version)
	}
	if _, err := b.C.Output(ctx, sshx.Command("mv", "-f", tmp, BinaryPath)); err != nil {
		return fmt.Errorf("install k3s: %w", err)
	}
	return nil
}

// download has the host download the release's checksum file and binary: kip reads the checksum
// the release lists for the binary (and refuses one that differs from a pinned checksum), and
// the host verifies the binary against it before it is installed.
func (b BinaryInstall) download(ctx context.Context) error {
	rel, err := ReleaseFor(b.Version, b.Arch)
	if err != nil {
		return err
	}
	out, err := b.C.Output(ctx, sshx.Command("curl", "-fsSL", "--retry", "3", rel.ChecksumsURL))
	if err != nil {
		return fmt.Errorf("download %s on the host: %w (the host needs curl and access to github.com; or pass --airgap-bundle)", rel.ChecksumsURL, err)
	}
	want, err := ChecksumFor(out, rel.Binary)
	if err != nil {
		return fmt.Errorf("%s: %w", rel.ChecksumsURL, err)
	}
	if err := b.CheckPinned(want); err != nil {
		return err
	}
	return b.put(ctx, func(ctx context.Context, tmp string) error {
		verify := fmt.Sprintf("printf '%%s  %%s\\n' %s %s | sha256sum -c --status", sshx.Quote(want), sshx.Quote(tmp))
		cmd := sshx.Command("curl", "-fsSL", "--retry", "3", "-o", tmp, rel.BinaryURL) + " && " + verify +
			" || { rc=$?; " + sshx.Command("rm", "-f", tmp) + "; exit $rc; }"
		if _, err := b.C.Output(ctx, cmd); err != nil {
			return fmt.Errorf("download k3s %s and verify it against the release's checksum: %w", b.Version, err)
		}
		return nil
	})
}

// BackupCommand is a shell command that keeps each file's previous content beside it
// (BackupSuffix), and notes a file that did not exist by removing its old backup, so that a
// restore removes it again.
func BackupCommand(paths ...string) string {
	return `for f in ` + sshx.QuoteAll(paths) + `; do if [ -f "$f" ]; then cp -p "$f" "$f` + BackupSuffix + `"; else rm -f "$f` + BackupSuffix + `"; fi; done`
}

// RestoreCommand is a shell command that puts back what BackupCommand kept.
func RestoreCommand(paths ...string) string {
	return `for f in ` + sshx.QuoteAll(paths) + `; do if [ -f "$f` + BackupSuffix + `" ]; then cp -p "$f` + BackupSuffix + `" "$f"; else rm -f "$f"; fi; done`
}
