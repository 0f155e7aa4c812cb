package install

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"strings"
	"time"

	"kipper.run/kip/internal/buildinfo"
	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/workflow"
)

// IntentPath is where an install keeps its intent (cluster.Intent) on the server, from its first
// host change until it finishes. docs/install.md describes it.
const IntentPath = "/var/lib/kipper/install-intent.json"

// parseIntent reads the intent file's content ("" when there is none).
func parseIntent(data string) (*cluster.Intent, error) {
	if strings.TrimSpace(data) == "" {
		return nil, nil
	}
	var u cluster.Intent
	if err := json.Unmarshal([]byte(data), &u); err != nil {
		return nil, fmt.Errorf("%s on the server is damaged (%v): delete it on the server, then run kip install again", IntentPath, err)
	}
	return &u, nil
}

// settle decides what this run installs when the host is not new: a re-run keeps what the
// cluster record says and changes only what a flag asks for, and a run after an interrupted
// one continues it or refuses. It runs before preflight, which then checks what was settled.
func (in *installer) settle() error {
	in.adminEmail, in.backups = in.o.AdminEmail, in.o.Backups
	if in.rerun {
		if err := in.keepRecorded(); err != nil {
			return err
		}
		recorded, err := components.Recorded(in.record, in.pinned, buildinfo.Version)
		if err != nil {
			return err
		}
		if in.backups == nil {
			in.backups = recorded.Backups // the cluster keeps the credentials
		}
		if in.adminEmail == "" {
			in.adminEmail = recorded.AdminEmail
		}
	}
	if in.state.intent != nil {
		return in.resume(*in.state.intent)
	}
	return nil
}

// resume continues the unfinished install whose intent the server holds: flags that would
// change it are refused, naming each difference, and what the flags leave open comes from it.
func (in *installer) resume(u cluster.Intent) error {
	which := fmt.Sprintf("install started on %s at %s (%s)", in.o.Host, u.StartedAt.Local().Format(time.DateTime), u.StartedBy)
	started := "an " + which + " has not finished"
	var diff []string
	differ := func(flag, given, recorded string) {
		if given != "" && given != recorded {
			diff = append(diff, fmt.Sprintf("%s %s, where it has %s", flag, given, cli.OrNone(recorded)))
		}
	}
	differ("--profile", in.o.Profile, u.Profile)
	differ("--storage", in.o.Storage, u.Storage)
	differ("--admin-email", in.o.AdminEmail, u.AdminEmail)
	if in.o.Backups != nil && !in.o.Backups.Location().Equal(u.BackupLocation) {
		diff = append(diff, "--backup-storage-bucket "+in.o.Backups.Bucket+", where it has "+backupWords(u))
	}
	if len(diff) > 0 {
		return fmt.Errorf("%s, and this run would change it: %s. Run the command that started it to continue, or delete %s on the server to start over with these flags",
			started, strings.Join(diff, "; "), IntentPath)
	}
	if in.backups == nil && u.Backups == cluster.BackupsExternal {
		// kip keeps no secret on the server: the keys come with the flags again.
		return fmt.Errorf("%s; it was given backup storage (bucket %s), whose keys kip does not keep: run it again with the same --backup-storage-* flags", started, u.BackupLocation.Bucket)
	}
	p, err := cluster.ProfileNamed(u.Profile)
	if err != nil {
		return fmt.Errorf("%s on the server names profile %q: %w", IntentPath, u.Profile, err)
	}
	in.sizing = cluster.Sizing{Profile: p, Storage: u.Storage,
		ProfileReason: "chosen when this install started", StorageReason: "chosen when this install started"}
	in.network, in.resumed = u.Network, true
	if in.adminEmail == "" {
		in.adminEmail = u.AdminEmail
	}
	in.p.Info("Continuing the " + which)
	return nil
}

func backupWords(u cluster.Intent) string {
	switch u.Backups {
	case cluster.BackupsExternal:
		return "bucket " + u.BackupLocation.Bucket
	case cluster.BackupsInCluster:
		return "backups in the cluster's MinIO"
	}
	return "no backups"
}

// intent is what this run decided, as the server keeps it.
func (in *installer) intent() cluster.Intent {
	mode, loc := components.BackupsOf(components.Options{Sizing: in.sizing, Backups: in.backups})
	return cluster.Intent{
		Profile: in.sizing.Profile.Name, Storage: in.sizing.Storage, Network: in.network,
		Backups: mode, BackupLocation: loc, AdminEmail: in.adminEmail,
		StartedBy: in.env.CommandLine, StartedAt: in.started.UTC(),
	}
}

// readIntent reads the intent file on the server.
func (in *installer) readIntent(ctx context.Context) (*cluster.Intent, error) {
	out, err := in.c.Output(ctx, "if [ -f "+sshx.Quote(IntentPath)+" ]; then "+sshx.Command("cat", IntentPath)+"; fi")
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", IntentPath, err)
	}
	return parseIntent(string(out))
}

// intentStep records this run's intent on the server before anything else changes there.
func (in *installer) intentStep() workflow.Step {
	want := in.intent()
	return workflow.Step{
		Name: "host-intent", Title: "Record this install's choices on the server",
		Done: "Recorded this install's choices at " + IntentPath, Already: "This install's choices already recorded on the server",
		Check: func(ctx context.Context) (bool, error) {
			if !in.intentWritten {
				// What the probe read at the start of this run: nothing has changed it since. A
				// re-run that changes none of the recorded choices has nothing to record.
				if in.state.intent == nil {
					return in.rerun && in.record.Choices().Same(want), nil
				}
				return in.state.intent.Same(want), nil
			}
			have, err := in.readIntent(ctx)
			return err == nil && have != nil && have.Same(want), err
		},
		Plan: func(context.Context) ([]string, error) {
			return []string{fmt.Sprintf("write %s: %s profile, %s storage, %s, %s", IntentPath, want.Profile, want.Storage, want.Network, backupWords(want))}, nil
		},
		Apply: func(ctx context.Context) error {
			data, err := json.MarshalIndent(want, "", "  ")
			if err != nil {
				return err
			}
			if err := in.run(ctx, "create "+path.Dir(IntentPath), sshx.Command("mkdir", "-p", "-m", "0700", path.Dir(IntentPath))); err != nil {
				return err
			}
			in.intentWritten = true
			return in.c.Upload(ctx, IntentPath, append(data, '\n'), 0o600, "")
		},
	}
}

// finishStep removes the intent from the server: the install is finished, and the cluster
// record holds what it decided.
func (in *installer) finishStep() workflow.Step {
	return workflow.Step{
		Name: "host-intent-done", Title: "Mark the install finished on the server",
		Done: "The install is finished", Already: "The install is finished",
		Check: func(ctx context.Context) (bool, error) {
			if !in.intentWritten && in.state.intent == nil {
				return true, nil // there was none, and this run wrote none
			}
			have, err := in.readIntent(ctx)
			return err == nil && have == nil, err
		},
		Apply: func(ctx context.Context) error {
			return in.run(ctx, "remove "+IntentPath, sshx.Command("rm", "-f", IntentPath))
		},
	}
}
