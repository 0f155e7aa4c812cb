package k3s

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"slices"
	"strings"

	"kipper.run/kip/internal/sshx"
)

// PendingPath marks a change of the server's configuration that k3s has not run on yet. It is
// written in the same remote command as the backups of the files the change replaces, and names
// them; it goes once k3s answers on the new files, or once the previous ones are restored. A kip
// stopped anywhere in between finds it on its next run: the change is finished (the files
// written, k3s restarted on them) rather than taken for one that needs no restart, and a
// rollback knows which backups are this change's.
const PendingPath = ConfigPath + ".kipper-pending"

// File is a file of a server's k3s configuration, as kip writes it.
type File struct {
	Path string
	Data []byte
	Mode os.FileMode
}

// ConfigChange writes a server's k3s configuration and restarts k3s on it: kip install and kip
// upgrade both change the server's configuration through it.
type ConfigChange struct {
	C     *sshx.Client
	Files []File
	// Unit is k3s's service; Verb is how it is brought up on the new files: "restart", or
	// "start" for a first start (which has no previous configuration to restore).
	Unit, Verb string
	// Wait waits for k3s's API once k3s is up on the new files (and for whatever else they must
	// bring back); WaitRestored, when set, once it is up on the restored ones instead.
	Wait, WaitRestored func(ctx context.Context) error
	// Up, when set, brings k3s up on the files in place and waits for it instead of systemctl
	// Verb and Wait (or, restored, systemctl restart and WaitRestored): for a change k3s needs
	// more than one restart to settle on.
	Up func(ctx context.Context, restored bool) error
	// Again is the command that continues once the server answers again.
	Again string
	// Warn tells the operator of a rollback as it starts.
	Warn func(msg string)
}

// ConfigState is what the server has of a change: the files a pending change replaced (Pending
// reports one) and the checksum of each of the change's files that exists.
type ConfigState struct {
	Pending  bool
	Replaced []string
	Sums     map[string]string
}

// Read reads the change's state on the server, in one round trip.
func (ch ConfigChange) Read(ctx context.Context) (ConfigState, error) {
	const sep = "--kip-sums--"
	out, err := ch.C.Query(ctx, `if [ -f `+sshx.Quote(PendingPath)+` ]; then echo pending; cat `+sshx.Quote(PendingPath)+`; fi; echo `+sep+`; `+
		`for f in `+sshx.QuoteAll(ch.paths())+`; do if [ -f "$f" ]; then sha256sum "$f"; fi; done`)
	if err != nil {
		return ConfigState{}, fmt.Errorf("read k3s's configuration on the server: %w", err)
	}
	marker, sums, _ := strings.Cut(string(out), sep+"\n")
	st := ConfigState{Sums: map[string]string{}}
	for i, line := range strings.Split(strings.TrimSpace(marker), "\n") {
		switch {
		case i == 0:
			st.Pending = line == "pending"
		case line != "":
			st.Replaced = append(st.Replaced, line)
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(sums), "\n") {
		if sum, p, ok := strings.Cut(line, "  "); ok {
			st.Sums[p] = sum
		}
	}
	return st, nil
}

// Done reports whether the change is complete: no restart pending, and every file on the
// server as kip writes it.
func (ch ConfigChange) Done(st ConfigState) bool {
	return !st.Pending && !slices.ContainsFunc(ch.Files, func(f File) bool { return st.Sums[f.Path] != sshx.SHA256(f.Data) })
}

func (ch ConfigChange) paths() []string {
	var out []string
	for _, f := range ch.Files {
		out = append(out, f.Path)
	}
	return out
}

// Write puts the files in place, each previous one kept beside it (BackupSuffix): the backups of
// the files that differ and the pending marker naming them in one command, then each file. A
// file that a pending change (an earlier run's) already replaced keeps that change's backup,
// which holds the file as it was before kip touched it; any other that differs is backed up and
// added to the marker.
func (ch ConfigChange) Write(ctx context.Context, st ConfigState) error {
	var backup []string
	dirs := []string{"-p", "-m", "0700"}
	for _, f := range ch.Files {
		if st.Sums[f.Path] != sshx.SHA256(f.Data) && !(st.Pending && slices.Contains(st.Replaced, f.Path)) {
			backup = append(backup, f.Path)
		}
		if !slices.Contains(dirs, path.Dir(f.Path)) {
			dirs = append(dirs, path.Dir(f.Path))
		}
	}
	if len(backup) > 0 {
		redirect := " > "
		if st.Pending {
			redirect = " >> "
		}
		marker := "printf '%s\\n' " + sshx.QuoteAll(backup) + redirect + sshx.Quote(PendingPath)
		cmd := sshx.Command("mkdir", dirs...) + " && " + BackupCommand(backup...) + " && { umask 077; " + marker + "; }"
		if _, err := ch.C.Output(ctx, cmd); err != nil {
			return fmt.Errorf("back up k3s's configuration: %w", err)
		}
	}
	for _, f := range ch.Files {
		if st.Sums[f.Path] == sshx.SHA256(f.Data) {
			continue
		}
		if err := ch.C.Upload(ctx, f.Path, f.Data, f.Mode, ""); err != nil {
			return err
		}
	}
	return nil
}

// Restart brings k3s up on the files and waits for its API, then clears the pending marker.
// When k3s does not come back on a change that replaced config.yaml, the previous files are
// restored and k3s restarted on them; a change that left config.yaml as it was (a new audit
// policy, say) restores nothing: the backup may predate the operator's own edits, so the error
// names the files and leaves the decision to the operator.
func (ch ConfigChange) Restart(ctx context.Context, st ConfigState) error {
	err := ch.up(ctx, false)
	if err == nil {
		return ch.clear(ctx)
	}
	switch {
	case ch.Verb != "restart":
		return fmt.Errorf("k3s did not come up: %w (see 'journalctl -u %s' on the server; kip's configuration is %s)", err, ch.Unit, ConfigPath)
	case !slices.Contains(st.Replaced, ConfigPath):
		return fmt.Errorf("k3s did not come back after a restart that left %s as it was (%w); kip restored nothing: %s may predate edits made since, so putting it back is your decision. "+
			"See 'journalctl -u %s' on the server; kip's files are %s; %s restarts k3s again", ConfigPath, err, ConfigBackupPath, ch.Unit, strings.Join(ch.paths(), ", "), ch.Again)
	}
	ch.Warn("k3s did not come back on the new configuration: restoring the previous files (*" + BackupSuffix + ") and restarting k3s on them")
	return ch.rollback(ctx, st.Replaced, err)
}

// up brings k3s up on the new files, or (restored) on the previous ones, and waits for it.
func (ch ConfigChange) up(ctx context.Context, restored bool) error {
	if ch.Up != nil {
		return ch.Up(ctx, restored)
	}
	verb, wait := ch.Verb, ch.Wait
	if restored {
		verb = "restart"
		if ch.WaitRestored != nil {
			wait = ch.WaitRestored
		}
	}
	if _, err := ch.C.Output(ctx, sshx.Command("systemctl", verb, ch.Unit)); err != nil {
		return fmt.Errorf("%s k3s: %w", verb, err)
	}
	return wait(ctx)
}

// clear removes the pending marker: k3s runs on the files it named.
func (ch ConfigChange) clear(ctx context.Context) error {
	if _, err := ch.C.Output(ctx, sshx.Command("rm", "-f", PendingPath)); err != nil {
		return fmt.Errorf("clear %s: %w", PendingPath, err)
	}
	return nil
}

// rollback restores the files a change replaced (and with them clears the marker, in one
// command) and restarts k3s on them. Its error tells the three outcomes apart: k3s back on the
// previous files; k3s down on them too; the server lost before kip could restore them.
func (ch ConfigChange) rollback(ctx context.Context, replaced []string, cause error) error {
	_, err := ch.C.Output(ctx, RestoreCommand(replaced...)+" && "+sshx.Command("rm", "-f", PendingPath))
	if err != nil {
		if errors.Is(err, sshx.ErrUnreachable) {
			return fmt.Errorf("k3s did not come up on the new configuration (%v), and kip lost the server before it could restore the previous one (%w): "+
				"when the server answers again, run %s to continue; the previous files are beside the new ones as *%s", cause, err, ch.Again, BackupSuffix)
		}
		return fmt.Errorf("k3s did not come up on the new configuration (%v), and restoring the previous one failed: %w; inspect the server: 'journalctl -u %s', %s", cause, err, ch.Unit, ConfigBackupPath)
	}
	if err := ch.up(ctx, true); err != nil {
		return fmt.Errorf("k3s did not come up on the new configuration (%v), and not on the restored previous one either: %w; inspect the server: 'journalctl -u %s'", cause, err, ch.Unit)
	}
	return fmt.Errorf("k3s did not come up on the new configuration (%w): kip restored the previous configuration and k3s runs on it again; see 'journalctl -u %s' on the server for why the new one failed (the new files' previous versions stay as *%s)", cause, ch.Unit, BackupSuffix)
}
