package sshx

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kevinburke/ssh_config"
)

// Config says how to reach one host. Zero fields are filled from the OpenSSH client configuration
// and then from kip's defaults (see the package documentation).
type Config struct {
	// Host is an address, a DNS name or an alias from the SSH client configuration.
	Host string
	// Port is the SSH port (default: the SSH configuration's Port, else 22).
	Port int
	// User is the remote user (default: the SSH configuration's User, else root). Any user but
	// root runs commands through passwordless sudo.
	User string
	// KeyPath is the private key to log in with (default: the SSH configuration's IdentityFile).
	// Without one, kip uses the keys in ssh-agent.
	KeyPath string
	// KnownHostsPath is kip's known_hosts file (default ~/.kip/known_hosts).
	KnownHostsPath string
	// Timeout bounds each attempt to connect and complete the SSH handshake (default 10 s).
	Timeout time.Duration
	// Passphrase asks the operator for an encrypted key's passphrase; nil when kip is not
	// running in a terminal.
	Passphrase func(prompt string) ([]byte, error)
	// Notify receives notices for the operator: a newly trusted host key, a retried connection.
	Notify func(msg string)
	// SSHConfigPath is the OpenSSH client configuration to resolve Host through (default
	// ~/.ssh/config; a missing default file is not an error).
	SSHConfigPath string
}

const (
	defaultUser    = "root"
	defaultPort    = 22
	defaultTimeout = 10 * time.Second
)

// resolve returns cfg with every connection setting filled in.
func (cfg Config) resolve() (Config, error) {
	if cfg.Host == "" {
		return cfg, errors.New("no host given")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return cfg, err
	}
	sc, scPath, err := loadSSHConfig(cfg.SSHConfigPath, home)
	if err != nil {
		return cfg, err
	}
	// Every setting is looked up for the host as given, as OpenSSH does, even after HostName.
	alias := cfg.Host
	get := func(key string) string {
		if sc == nil {
			return ""
		}
		v, _ := sc.Get(alias, key) // an error only reports a broken conditional Include
		return v
	}

	if cfg.Port == 0 {
		if p := get("Port"); p != "" {
			if cfg.Port, err = strconv.Atoi(p); err != nil || cfg.Port < 1 || cfg.Port > 65535 {
				return cfg, fmt.Errorf("%s: invalid Port %q for host %s", scPath, p, alias)
			}
		} else {
			cfg.Port = defaultPort
		}
	}
	if cfg.User == "" {
		cfg.User = get("User")
	}
	if cfg.User == "" {
		cfg.User = defaultUser
	}
	if h := get("HostName"); h != "" {
		cfg.Host = h
	}
	if cfg.KeyPath == "" {
		if f := get("IdentityFile"); f != "" && !strings.EqualFold(f, "none") {
			cfg.KeyPath = expandTokens(expandHome(f, home), home, alias, cfg)
		}
	} else {
		cfg.KeyPath = expandHome(cfg.KeyPath, home) // KIP_SSH_KEY=~/... reaches kip unexpanded
	}
	if cfg.KnownHostsPath == "" {
		cfg.KnownHostsPath = filepath.Join(home, ".kip", "known_hosts")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = defaultTimeout
	}
	return cfg, nil
}

// loadSSHConfig parses the OpenSSH client configuration at path (~/.ssh/config when empty) and
// returns it with the path it read. The configuration is nil when the default file does not exist.
// Only this file is read, never the system-wide one, so that the result depends on nothing but
// the given path.
func loadSSHConfig(path, home string) (*ssh_config.Config, string, error) {
	explicit := path != ""
	if !explicit {
		path = filepath.Join(home, ".ssh", "config")
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) && !explicit {
		return nil, path, nil
	}
	if err != nil {
		return nil, path, fmt.Errorf("read SSH config: %w", err)
	}
	defer f.Close()
	c, err := ssh_config.Decode(f)
	if err != nil {
		return nil, path, fmt.Errorf("parse SSH config %s: %w", path, err)
	}
	return c, path, nil
}

// expandHome expands a leading ~ to the home directory.
func expandHome(p, home string) string {
	if p == "~" || strings.HasPrefix(p, "~/") {
		return home + p[1:]
	}
	return p
}

// expandTokens expands the ssh_config tokens %d (home), %u (local user), %h (remote host), %n
// (the host as given), %p (port), %r (remote user) and %% in an IdentityFile path.
func expandTokens(p, home, alias string, cfg Config) string {
	if !strings.Contains(p, "%") {
		return p
	}
	local := ""
	if u, err := user.Current(); err == nil {
		local = u.Username
	}
	return strings.NewReplacer(
		"%%", "%", "%d", home, "%u", local, "%h", cfg.Host, "%n", alias,
		"%p", strconv.Itoa(cfg.Port), "%r", cfg.User,
	).Replace(p)
}

// addr returns the resolved host:port.
func (cfg Config) addr() string { return net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)) }

// label names the resolved destination in messages: user@host:port.
func (cfg Config) label() string { return cfg.User + "@" + cfg.addr() }

func (cfg Config) notify(format string, args ...any) {
	if cfg.Notify != nil {
		cfg.Notify(fmt.Sprintf(format, args...))
	}
}
