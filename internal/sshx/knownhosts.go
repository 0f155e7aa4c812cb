package sshx

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/gofrs/flock"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// hostKeys verifies server host keys against kip's known_hosts file, trusting a host's key on
// first use.
type hostKeys struct {
	path   string
	notify func(format string, args ...any)
}

// probeKey is a key no server has. Checking it for a host makes knownhosts list the host's
// known keys (in the KeyError), which is the only way its API exposes them.
var probeKey = sync.OnceValue(func() ssh.PublicKey {
	pub, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	key, err := ssh.NewPublicKey(pub)
	if err != nil {
		panic(err)
	}
	return key
})

// anyAddr stands in for the server's address: knownhosts checks the host name it is given.
var anyAddr = &net.TCPAddr{IP: net.IPv4zero}

// callback returns the host key callback for a connection to addr (host:port), and the keys
// known for addr. Negotiate only their algorithms (hostKeyAlgorithms), so that a server that has
// several host keys offers the one kip knows instead of one that would look like a changed key.
func (h hostKeys) callback(addr string) (ssh.HostKeyCallback, []knownhosts.KnownKey, error) {
	if err := os.MkdirAll(filepath.Dir(h.path), 0o700); err != nil {
		return nil, nil, err
	}
	f, err := os.OpenFile(h.path, os.O_CREATE|os.O_RDONLY, 0o600)
	if err != nil {
		return nil, nil, err
	}
	f.Close()
	check, err := knownhosts.New(h.path)
	if err != nil {
		return nil, nil, fmt.Errorf("read known hosts: %w", err)
	}
	var known []knownhosts.KnownKey
	if keyErr := (*knownhosts.KeyError)(nil); errors.As(check(addr, anyAddr, probeKey()), &keyErr) {
		known = keyErr.Want
	}
	return func(_ string, remote net.Addr, key ssh.PublicKey) error {
		if unknown, err := h.verify(check, addr, remote, key); !unknown {
			return err
		}
		return h.trust(addr, remote, key)
	}, known, nil
}

// verify checks key for addr: unknown is true when addr has no known key yet; otherwise err is
// nil for the known key and explains a changed one.
func (h hostKeys) verify(check ssh.HostKeyCallback, addr string, remote net.Addr, key ssh.PublicKey) (unknown bool, err error) {
	var keyErr *knownhosts.KeyError
	if err := check(addr, remote, key); !errors.As(err, &keyErr) {
		return false, err
	}
	if len(keyErr.Want) > 0 {
		return false, h.changed(addr, keyErr.Want, key)
	}
	return true, nil
}

// trust records key as addr's host key, unless another kip recorded one while this one was
// connecting: the file is locked and checked again before the key is appended.
func (h hostKeys) trust(addr string, remote net.Addr, key ssh.PublicKey) error {
	lock := flock.New(h.path)
	if err := lock.Lock(); err != nil {
		return fmt.Errorf("lock known hosts: %w", err)
	}
	defer lock.Unlock()
	check, err := knownhosts.New(h.path)
	if err != nil {
		return fmt.Errorf("read known hosts: %w", err)
	}
	if unknown, err := h.verify(check, addr, remote, key); !unknown {
		return err
	}

	data, err := os.ReadFile(h.path)
	if err != nil {
		return err
	}
	line := knownhosts.Line([]string{addr}, key) + "\n"
	if len(data) > 0 && !bytes.HasSuffix(data, []byte("\n")) {
		line = "\n" + line
	}
	f, err := os.OpenFile(h.path, os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(line); err != nil {
		f.Close()
		return fmt.Errorf("save host key: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("save host key: %w", err)
	}
	h.notify("Trusted new host key for %s (%s), saved in %s", addr, ssh.FingerprintSHA256(key), h.path)
	return nil
}

// hostKeyError refuses a host whose key has changed; forget is the command that removes the
// known key from kip's known_hosts.
type hostKeyError struct {
	error
	forget string
}

// HostKeyChanged reports whether err refuses a host because its key is not the one kip's
// known_hosts holds for it, and returns the command that removes the known key once the new one
// is verified: ssh-keygen -f FILE -R HOST, HOST written [host]:port for a port other than 22.
func HostKeyChanged(err error) (forget string, ok bool) {
	var e hostKeyError
	if !errors.As(err, &e) {
		return "", false
	}
	return e.forget, true
}

// changed explains a host key that differs from the known one(s) and how to accept it.
func (h hostKeys) changed(addr string, known []knownhosts.KnownKey, offered ssh.PublicKey) error {
	return hostKeyError{fmt.Errorf("host key for %s has changed: the server offered %s %s but kip knows %s; %s",
		addr, offered.Type(), ssh.FingerprintSHA256(offered), describeKeys(known), h.remedy(addr, known)), h.forget(addr)}
}

// unoffered explains a server that offers no host key of the types known for it, which is a
// changed key too.
func (h hostKeys) unoffered(addr string, known []knownhosts.KnownKey, err error) error {
	return hostKeyError{fmt.Errorf("host key for %s has changed: the server offers no key of the type kip knows, %s; %s (%w)",
		addr, describeKeys(known), h.remedy(addr, known), err), h.forget(addr)}
}

// forget is the command that removes addr's known keys from kip's known_hosts.
func (h hostKeys) forget(addr string) string {
	return fmt.Sprintf("ssh-keygen -f %s -R %s", Quote(h.path), Quote(knownhosts.Normalize(addr)))
}

func describeKeys(known []knownhosts.KnownKey) string {
	var keys []string
	for _, k := range known {
		keys = append(keys, fmt.Sprintf("%s %s (%s line %d)", k.Key.Type(), ssh.FingerprintSHA256(k.Key), k.Filename, k.Line))
	}
	return strings.Join(keys, " and ")
}

// remedy warns about interception and tells how to accept a host's new key.
func (h hostKeys) remedy(addr string, known []knownhosts.KnownKey) string {
	var lines []string
	for _, k := range known {
		lines = append(lines, strconv.Itoa(k.Line))
	}
	return fmt.Sprintf("someone may be intercepting the connection. If the server was really reinstalled, "+
		"remove line %s from %s (%s) and connect again",
		strings.Join(lines, ", "), h.path, h.forget(addr))
}

// hostKeyAlgorithms returns the host key algorithms that can present the known keys, or nil (the
// library's defaults) when none is known.
func hostKeyAlgorithms(known []knownhosts.KnownKey) []string {
	var algos []string
	for _, k := range known {
		candidates := []string{k.Key.Type()}
		if k.Key.Type() == ssh.KeyAlgoRSA {
			candidates = []string{ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSA}
		}
		for _, a := range candidates {
			if !slices.Contains(algos, a) {
				algos = append(algos, a)
			}
		}
	}
	return algos
}
