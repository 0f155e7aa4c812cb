package sshx

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
)

// keyAdvice is how the operator gives kip a key.
const keyAdvice = "pass --ssh-key, set KIP_SSH_KEY, or load a key into ssh-agent (ssh-add)"

// credentials are the keys a Client logs in with: one private key, or the keys in ssh-agent.
type credentials struct {
	keyPath   string
	signer    ssh.Signer // set with keyPath
	agentSock string     // SSH_AUTH_SOCK, without keyPath
}

// newCredentials loads cfg.KeyPath, asking for its passphrase if needed, or settles on ssh-agent.
func newCredentials(cfg Config) (*credentials, error) {
	if cfg.KeyPath != "" {
		signer, err := loadKey(cfg.KeyPath, cfg.Passphrase)
		if err != nil {
			return nil, err
		}
		return &credentials{keyPath: cfg.KeyPath, signer: signer}, nil
	}
	sock := os.Getenv("SSH_AUTH_SOCK")
	if sock == "" {
		return nil, errors.New("no SSH key to log in with (no ssh-agent: SSH_AUTH_SOCK is not set): " + keyAdvice)
	}
	return &credentials{agentSock: sock}, nil
}

// loadKey reads a private key, decrypting it with a passphrase from ask when it is encrypted.
func loadKey(path string, ask func(prompt string) ([]byte, error)) (ssh.Signer, error) {
	pemBytes, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read SSH key: %w", err)
	}
	signer, err := ssh.ParsePrivateKey(pemBytes)
	var encrypted *ssh.PassphraseMissingError
	if !errors.As(err, &encrypted) {
		if err != nil {
			return nil, fmt.Errorf("SSH key %s: %w", path, err)
		}
		return signer, nil
	}
	if ask == nil {
		return nil, fmt.Errorf("SSH key %s is encrypted: load it into ssh-agent (ssh-add %s) or run kip in a terminal", path, Quote(path))
	}
	pass, err := ask("Enter passphrase for " + path + ": ")
	if err != nil {
		return nil, fmt.Errorf("read passphrase for SSH key %s: %w", path, err)
	}
	defer clear(pass)
	signer, err = ssh.ParsePrivateKeyWithPassphrase(pemBytes, pass)
	if errors.Is(err, x509.IncorrectPasswordError) {
		return nil, fmt.Errorf("SSH key %s: wrong passphrase", path)
	}
	if err != nil {
		return nil, fmt.Errorf("SSH key %s: %w", path, err)
	}
	return signer, nil
}

// methods returns the authentication methods for one connection and a function that releases
// them once the handshake is over.
func (c *credentials) methods() ([]ssh.AuthMethod, func(), error) {
	if c.signer != nil {
		return []ssh.AuthMethod{ssh.PublicKeys(c.signer)}, func() {}, nil
	}
	conn, err := net.Dial("unix", c.agentSock)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to ssh-agent (SSH_AUTH_SOCK=%s): %w", c.agentSock, err)
	}
	signers, err := agent.NewClient(conn).Signers()
	if err == nil && len(signers) == 0 {
		err = errors.New("ssh-agent holds no keys: " + keyAdvice)
	}
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return []ssh.AuthMethod{ssh.PublicKeys(signers...)}, func() { conn.Close() }, nil
}

// explainAuth rewrites the handshake's authentication failure so that it names the key offered
// and the user. x/crypto reports it only as text ("ssh: unable to authenticate, ...").
func (c *credentials) explainAuth(err error, user string) error {
	if !strings.Contains(err.Error(), "unable to authenticate") {
		return err
	}
	offered := "the keys in ssh-agent"
	if c.keyPath != "" {
		offered = "key " + c.keyPath
	}
	return fmt.Errorf("the server refused %s for user %s: %w", offered, user, err)
}
