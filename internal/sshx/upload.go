package sshx

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path"
	"strings"
)

// Upload writes data to the absolute path on the host atomically, in one remote command: it
// writes a temporary file next to path, checks its SHA-256 against data's, sets its permission
// bits to mode and, when owner is not empty, its owner (chown syntax: "user" or "user:group"),
// then renames it onto path. Readers of path see the old content or the new, never a part or a
// corrupted copy; the temporary file is removed if a step fails.
func (c *Client) Upload(ctx context.Context, dst string, data []byte, mode os.FileMode, owner string) error {
	if !path.IsAbs(dst) {
		return c.wrapErr(fmt.Errorf("upload %q: the path must be absolute", dst))
	}
	sum := sha256.Sum256(data)
	// The temporary file is named by its content: two uploads of different files never share
	// one, and an upload made again is the same command (a fault-injection test knows a remote
	// write by its command, fault.KillNewWriteEnv).
	tmp := fmt.Sprintf("%s.kip-tmp-%x", dst, sum[:8])
	steps := []string{
		"umask 077",
		"cat >" + Quote(tmp),
		fmt.Sprintf("{ printf '%%s  %%s\\n' %x %s | sha256sum -c --status || { echo 'the uploaded file does not match what kip sent (sha256 %x)' >&2; false; }; }",
			sum, Quote(tmp), sum),
		Command("chmod", fmt.Sprintf("%04o", mode.Perm()), tmp),
	}
	if owner != "" {
		steps = append(steps, Command("chown", owner, tmp))
	}
	steps = append(steps, Command("mv", "-f", tmp, dst))
	cmd := strings.Join(steps, " && ") + " || { rc=$?; rm -f " + Quote(tmp) + "; exit $rc; }"
	res, err := c.RunInput(ctx, cmd, bytes.NewReader(data))
	if err != nil {
		return err
	}
	return res.Err()
}
