package credential

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/workflow"
)

// Grant is what the upgrade's seed writes on one credential whose allow-list was never set: the
// projects whose apps use it, sorted.
type Grant struct {
	Credential string   `json:"credential"`
	Projects   []string `json:"projects"`
}

func (g Grant) String() string { return g.Credential + ": " + strings.Join(g.Projects, ", ") }

// Seeds decides the upgrade's seed from the credentials as read and refs (credential name → the
// projects whose apps name it, as the upgrade's check read the apps): for each credential whose
// allow-list was never set, a Grant of the projects that use it. A credential no app uses is
// left unset and returned in unused: seeding it would turn its allow-list on with no project, a
// change nobody asked for, so console-api goes on letting every project use it. A credential
// whose list is set is neither: the seed never touches it. Both come in the credentials' order
// (List sorts them by name).
func Seeds(creds []Credential, refs map[string][]string) (grants []Grant, unused []string) {
	for _, c := range creds {
		if c.Set {
			continue
		}
		projects := sortedUnique(refs[c.Name])
		if len(projects) == 0 {
			unused = append(unused, c.Name)
			continue
		}
		grants = append(grants, Grant{Credential: c.Name, Projects: projects})
	}
	return grants, unused
}

// WriteSeeds prints the seed for the upgrade's check, as its other findings: what kip upgrade
// would grant with consent, and the credentials it leaves as they are because no app uses them.
// It prints nothing when there is neither.
func WriteSeeds(w io.Writer, grants []Grant, unused []string) {
	if n := len(grants); n > 0 {
		fmt.Fprintf(w, "  ·   %s no allow-list yet: a cluster from before allow-lists,\n"+
			"      where every project's apps may use %s. With consent (a prompt, or --seed-credential-grants),\n"+
			"      kip upgrade grants %s the projects whose apps use it, and from then on only their apps may:\n",
			cli.Plural(n, "This shared git credential has", fmt.Sprintf("These %d shared git credentials have", n)), cli.Plural(n, "it", "them"), cli.Plural(n, "it", "each"))
		for _, g := range grants {
			fmt.Fprintf(w, "      - %s\n", g)
		}
	}
	if n := len(unused); n > 0 {
		fmt.Fprintf(w, "  ·   No app uses the shared git %s %s, so kip upgrade leaves %s without an allow-list\n"+
			"      (every project may use %s; 'kip credentials allow' sets one)\n",
			cli.Plural(n, "credential", "credentials"), strings.Join(unused, ", "), cli.Plural(n, "it", "them"), cli.Plural(n, "it", "them"))
	}
}

// maxAttempts bounds how often a write of one allow-list is tried against a Secret that keeps
// changing (console-api rotating its data, say) while its list stays unset.
const maxAttempts = 3

// SeedStep is the upgrade's step that writes the approved grants: each credential of grants
// whose allow-list is still unset gets the grant's projects, in one write each, tested against
// the resourceVersion kip read. A list set meanwhile, by console-api or an operator, is left as
// it is (the seed acts only where none was ever set), and so is a credential deleted meanwhile.
// The step is done when no granted credential is left without a list, so a run killed after any
// of its writes is finished by the next. report, when not nil, hears of each credential written
// or left alone.
func SeedStep(cl *kube.Clients, grants []Grant, report workflow.Reporter) workflow.Step {
	say := func(warn bool, msg string) {
		switch {
		case report == nil:
		case warn:
			report.Warn(msg)
		default:
			report.Info(msg)
		}
	}
	n := len(grants)
	return workflow.Step{
		Name:    "seed-credential-grants",
		Title:   fmt.Sprintf("Grant %s the projects whose apps use %s", cli.Plural(n, "the shared git credential", fmt.Sprintf("%d shared git credentials", n)), cli.Plural(n, "it", "them")),
		Done:    fmt.Sprintf("Granted %s the projects whose apps use %s", cli.Plural(n, "the shared git credential", fmt.Sprintf("%d shared git credentials", n)), cli.Plural(n, "it", "them")),
		Already: "Every shared git credential granted has an allow-list",
		Check: func(ctx context.Context) (bool, error) {
			pending, err := unseeded(ctx, cl, grants)
			return len(pending) == 0, err
		},
		Plan: func(ctx context.Context) ([]string, error) {
			pending, err := unseeded(ctx, cl, grants)
			var changes []string
			for _, p := range pending {
				changes = append(changes, fmt.Sprintf("allow-list of %s: never set → %s", p.c.Name, FormatAllowed(p.g.Projects)))
			}
			return changes, err
		},
		Apply: func(ctx context.Context) error {
			pending, err := unseeded(ctx, cl, grants)
			if err != nil {
				return err
			}
			for _, p := range pending {
				left, err := seed(ctx, cl, p.c, p.g)
				switch {
				case err != nil:
					return err
				case left != "":
					say(true, fmt.Sprintf("Left shared git credential %s as it is: %s", p.c.Name, left))
				default:
					say(false, fmt.Sprintf("Shared git credential %s: allowed for %s", p.c.Name, strings.Join(p.g.Projects, ", ")))
				}
			}
			return nil
		},
	}
}

// pendingGrant is a grant whose credential exists with its allow-list unset, as read.
type pendingGrant struct {
	c Credential
	g Grant
}

// unseeded reads the credentials (one request) and returns the grants still to write.
func unseeded(ctx context.Context, cl *kube.Clients, grants []Grant) ([]pendingGrant, error) {
	creds, err := List(ctx, cl)
	if err != nil {
		return nil, err
	}
	byName := map[string]Credential{}
	for _, c := range creds {
		byName[c.Name] = c
	}
	var pending []pendingGrant
	for _, g := range grants {
		if c, ok := byName[g.Credential]; ok && !c.Set {
			pending = append(pending, pendingGrant{c: c, g: g})
		}
	}
	return pending, nil
}

// seed writes grant g on credential c, read with its allow-list unset. When the Secret changed
// since, it reads it again: a list set meanwhile, or the credential gone, is left alone (left
// says why); otherwise it writes again at the new resourceVersion.
func seed(ctx context.Context, cl *kube.Clients, c Credential, g Grant) (left string, err error) {
	for range maxAttempts {
		err := writeAllowed(ctx, cl.Metadata, c, g.Projects)
		if !errors.Is(err, errConflict) {
			return "", err
		}
		now, err := get(ctx, cl.Metadata, c.Name)
		switch {
		case err != nil:
			return "", err
		case now == nil:
			return "it was deleted meanwhile", nil
		case now.Set:
			return fmt.Sprintf("its allow-list was set meanwhile (%s)", describeAllowed(*now)), nil
		}
		c = *now
	}
	return "", fmt.Errorf("write the allow-list of shared git credential %s: it changed each of the %d times kip wrote it", c.Name, maxAttempts)
}

// describeAllowed says what a credential's allow-list lets through.
func describeAllowed(c Credential) string {
	switch {
	case !c.Set:
		return "every project (never set)"
	case len(c.Allowed) == 0:
		return "no project"
	}
	return strings.Join(c.Allowed, ", ")
}
