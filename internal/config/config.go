// Package config reads and writes kip's local configuration, ~/.kip/config.yaml (the directory
// is $KIP_HOME when set). Writes are atomic (temporary file + rename), mode 0600, and
// serialised by a file lock so that two kip processes never lose each other's changes.
package config

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/gofrs/flock"
	"sigs.k8s.io/yaml"
)

// FileName is the configuration file inside the kip directory.
const FileName = "config.yaml"

// Config is the whole local configuration.
type Config struct {
	// Current names the cluster commands act on when neither --cluster nor KIP_CLUSTER is set.
	Current  string    `json:"current,omitempty"`
	Clusters []Cluster `json:"clusters,omitempty"`
}

// Cluster is one cluster this machine manages, and how to reach it.
type Cluster struct {
	Name       string `json:"name"`
	Host       string `json:"host"`
	SSHUser    string `json:"ssh_user,omitempty"`
	SSHPort    int    `json:"ssh_port,omitempty"`
	SSHKey     string `json:"ssh_key,omitempty"`
	Kubeconfig string `json:"kubeconfig,omitempty"`
}

// Dir returns kip's directory: $KIP_HOME, or ~/.kip.
func Dir() (string, error) {
	if d := os.Getenv("KIP_HOME"); d != "" {
		return d, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("find home directory (or set KIP_HOME): %w", err)
	}
	return filepath.Join(home, ".kip"), nil
}

// Store is the configuration file in one directory.
type Store struct{ Dir string }

func (s Store) path() string { return filepath.Join(s.Dir, FileName) }

// Load reads the configuration. A missing file is an empty configuration.
func (s Store) Load() (*Config, error) {
	data, err := os.ReadFile(s.path())
	if errors.Is(err, os.ErrNotExist) {
		return &Config{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", s.path(), err)
	}
	var c Config
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return nil, fmt.Errorf("parse %s: %w", s.path(), err)
	}
	return &c, nil
}

// lockTimeout bounds how long a kip waits for another kip writing the file.
const lockTimeout = 30 * time.Second

// Update reads the configuration under an exclusive file lock, applies fn, and writes the
// result atomically with mode 0600. When fn returns an error nothing is written.
func (s Store) Update(fn func(*Config) error) error {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", s.Dir, err)
	}
	lock := flock.New(s.path() + ".lock")
	ctx, cancel := context.WithTimeout(context.Background(), lockTimeout)
	defer cancel()
	ok, err := lock.TryLockContext(ctx, 50*time.Millisecond)
	if err != nil || !ok {
		return fmt.Errorf("lock %s: another kip is writing it (waited %s): %v", s.path(), lockTimeout, err)
	}
	defer lock.Unlock() //nolint:errcheck // closing the lock file releases it either way

	c, err := s.Load()
	if err != nil {
		return err
	}
	if err := fn(c); err != nil {
		return err
	}
	data, err := yaml.Marshal(c)
	if err != nil {
		return fmt.Errorf("encode configuration: %w", err)
	}
	return WriteFileAtomic(s.path(), data, 0o600)
}

// WriteFileAtomic writes data to a temporary file in path's directory with the given mode,
// syncs it and renames it over path, so readers see the old or the new file, never a part.
func WriteFileAtomic(path string, data []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) //nolint:errcheck // gone after a successful rename
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// Cluster returns the cluster named name; with an empty name, the current cluster, or the only
// one when there is exactly one.
func (c *Config) Cluster(name string) (*Cluster, error) {
	if name == "" {
		name = c.Current
	}
	if name == "" {
		switch len(c.Clusters) {
		case 0:
			return nil, errors.New("no cluster configured: run 'kip install --host HOST' first, or pass --kubeconfig")
		case 1:
			return &c.Clusters[0], nil
		default:
			return nil, fmt.Errorf("%d clusters configured (%s): choose one with --cluster or KIP_CLUSTER", len(c.Clusters), c.names())
		}
	}
	for i := range c.Clusters {
		if c.Clusters[i].Name == name {
			return &c.Clusters[i], nil
		}
	}
	if len(c.Clusters) == 0 {
		return nil, fmt.Errorf("cluster %q is not configured: no clusters are; run 'kip install --host HOST' first", name)
	}
	return nil, fmt.Errorf("cluster %q is not configured (known: %s)", name, c.names())
}

// Put adds or replaces the cluster with cl's name.
func (c *Config) Put(cl Cluster) {
	for i := range c.Clusters {
		if c.Clusters[i].Name == cl.Name {
			c.Clusters[i] = cl
			return
		}
	}
	c.Clusters = append(c.Clusters, cl)
	sort.Slice(c.Clusters, func(i, j int) bool { return c.Clusters[i].Name < c.Clusters[j].Name })
}

func (c *Config) names() string {
	s := ""
	for i, cl := range c.Clusters {
		if i > 0 {
			s += ", "
		}
		s += cl.Name
	}
	return s
}
