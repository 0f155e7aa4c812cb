package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Fault injection for kip's tests: a k3s that fails to start, as a real k3s does on a
// configuration it cannot run, and at a point a test chooses. docs/k3s-standin.md describes it.
const (
	// faultPath names the fault, one word: refuse-changed-config, refuse-every-start,
	// fail-changed-config-once or hold-changed-config.
	faultPath = "/etc/k3s-standin/fault"
	// heldPath is where a held start says it is waiting; it goes on when the file is removed.
	heldPath = "/var/lib/k3s-standin/held"
	// configPath and its backup are the configuration kip writes and the previous one it keeps.
	configPath       = "/etc/rancher/k3s/config.yaml"
	configBackupPath = configPath + ".kipper-bak"
)

// injectedFault returns the error a server start fails with under the configured fault, or nil.
//   - refuse-changed-config: the start fails while config.yaml differs from config.yaml.kipper-bak,
//     the previous configuration kip keeps, so that kip's restore brings k3s back.
//   - refuse-every-start: every start fails, the restored configuration's too.
//   - fail-changed-config-once: once, on a changed configuration, the start fails; the fault file
//     is removed as it fails, so that systemd's next restart starts normally (as a k3s start that
//     its kube-proxy ends when the Node's address moves under it).
//   - hold-changed-config: once, on a changed configuration, the start writes heldPath and waits
//     until a test removes it (having cut the host's network, say), then fails. The fault file is
//     removed as the hold begins, so that systemd's next restart starts normally.
func injectedFault(ctx context.Context) error {
	data, err := os.ReadFile(faultPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	fault := strings.TrimSpace(string(data))
	refused := fmt.Errorf("refusing to start: %s asks for %s", faultPath, fault)
	switch fault {
	case "refuse-every-start":
		return refused
	case "refuse-changed-config", "fail-changed-config-once", "hold-changed-config":
		if !configChanged() {
			return nil
		}
	default:
		return fmt.Errorf("%s: unknown fault %q (refuse-changed-config, refuse-every-start, fail-changed-config-once or hold-changed-config)", faultPath, fault)
	}
	switch fault {
	case "refuse-changed-config":
		return refused
	case "fail-changed-config-once":
		if err := os.Remove(faultPath); err != nil {
			return err
		}
		return refused
	}
	if err := os.Remove(faultPath); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(heldPath), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(heldPath, []byte("held\n"), 0o644); err != nil {
		return err
	}
	slog.Info("holding this start until " + heldPath + " is removed")
	for {
		if _, err := os.Stat(heldPath); errors.Is(err, os.ErrNotExist) {
			return refused
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// configChanged reports whether config.yaml differs from the backup kip kept of the previous one.
func configChanged() bool {
	now, err1 := os.ReadFile(configPath)
	before, err2 := os.ReadFile(configBackupPath)
	return err1 == nil && err2 == nil && !bytes.Equal(now, before)
}
