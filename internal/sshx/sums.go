package sshx

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// FileSums returns the SHA-256 of each path that exists on the host, by path, in one round trip.
func (c *Client) FileSums(ctx context.Context, paths ...string) (map[string]string, error) {
	out, err := c.Query(ctx, "for f in "+QuoteAll(paths)+`; do if [ -f "$f" ]; then sha256sum "$f"; fi; done`)
	if err != nil {
		return nil, fmt.Errorf("read checksums: %w", err)
	}
	sums := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if sum, path, ok := strings.Cut(line, "  "); ok {
			sums[path] = sum
		}
	}
	return sums, nil
}

// SHA256 is data's SHA-256 as sha256sum prints it.
func SHA256(data []byte) string {
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}
