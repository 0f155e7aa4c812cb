package main

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"kipper.run/kip/test/controlplane"
)

// token is a k3s join token: K10<sha256 of the server CA's PEM file>::<user>:<password>, or a bare
// password.
type token struct {
	caHash   string // empty for a bare password
	user     string
	password string
}

const tokenPrefix = "K10"

// parseToken reads a join token the way k3s does.
func parseToken(s string) (token, error) {
	if s == "" {
		return token{}, errors.New("token must not be empty")
	}
	if !strings.HasPrefix(s, tokenPrefix) {
		s = tokenPrefix + ":::" + s
	}
	s = strings.TrimPrefix(s, tokenPrefix)
	var t token
	hash, creds, ok := strings.Cut(s, "::")
	if !ok {
		creds, hash = hash, ""
	}
	if hash != "" && len(hash) != 2*sha256.Size {
		return token{}, errors.New("invalid token CA hash length")
	}
	t.caHash = hash
	user, password, ok := strings.Cut(creds, ":")
	if !ok || password == "" {
		return token{}, errors.New("invalid token format")
	}
	t.user, t.password = user, password
	return t, nil
}

// caHash returns the hex SHA-256 of a CA certificate file's bytes, as k3s puts it in tokens.
func caHash(caPEM []byte) string {
	sum := sha256.Sum256(caPEM)
	return hex.EncodeToString(sum[:])
}

// full returns the token in k3s's full form for the cluster whose CA file is caPEM.
func (t token) full(caPEM []byte) string {
	return tokenPrefix + caHash(caPEM) + "::" + t.user + ":" + t.password
}

// serverToken decides the server's token: --token (or --token-file), else the one written on an
// earlier start, else a new random one. A full token must name this cluster's CA.
func serverToken(o *options, tokenPath string, caPEM []byte) (token, error) {
	given, err := o.tokenValue()
	if err != nil {
		return token{}, err
	}
	if given == "" {
		data, err := os.ReadFile(tokenPath)
		switch {
		case err == nil:
			given = strings.TrimSpace(string(data))
		case errors.Is(err, fs.ErrNotExist):
			b := make([]byte, 16)
			if _, err := rand.Read(b); err != nil {
				return token{}, fmt.Errorf("generate token: %w", err)
			}
			given = hex.EncodeToString(b)
		default:
			return token{}, fmt.Errorf("read token: %w", err)
		}
	}
	t, err := parseToken(given)
	if err != nil {
		return token{}, err
	}
	if t.caHash != "" && t.caHash != caHash(caPEM) {
		return token{}, fmt.Errorf("token CA hash does not match the cluster CA certificate hash: %s != %s", t.caHash, caHash(caPEM))
	}
	if strings.ContainsAny(t.password, ",\"\r\n") {
		return token{}, errors.New("token must not contain commas, quotes or line breaks")
	}
	t.user = "server"
	return t, nil
}

// The token's password authenticates agents to kube-apiserver through its --token-auth-file as
// this user and group, which may create node client certificate requests and have them
// approved (see bootstrapRBAC).
const (
	bootstrapUser  = "system:bootstrap:k3s-standin"
	bootstrapGroup = "system:bootstrappers:k3s-standin"
)

// writeTokenFiles writes the token where k3s keeps it (server/token, and server/node-token
// linking to it) and kube-apiserver's token file.
func writeTokenFiles(serverDir, authFile string, t token, caPEM []byte) error {
	tokenPath := filepath.Join(serverDir, "token")
	if err := controlplane.WriteFile(tokenPath, []byte(t.full(caPEM)+"\n"), 0o600); err != nil {
		return err
	}
	nodeToken := filepath.Join(serverDir, "node-token")
	if target, err := os.Readlink(nodeToken); err != nil || target != tokenPath {
		if err := os.Remove(nodeToken); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("replace node-token: %w", err)
		}
		if err := os.Symlink(tokenPath, nodeToken); err != nil {
			return fmt.Errorf("link node-token: %w", err)
		}
	}
	line := fmt.Sprintf("%s,%s,%s,%q\n", t.password, bootstrapUser, bootstrapUser, bootstrapGroup)
	return controlplane.WriteFile(authFile, []byte(line), 0o600)
}
