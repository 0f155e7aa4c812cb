package credential

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/service"
)

// Options are what every kip credentials command needs, as every kip service and kip project
// command does; cmd/kip fills them.
type Options = service.Options

// Item is one credential as kip credentials list shows it, and its -o json shape.
type Item struct {
	Name string `json:"name"`
	// AllowListSet is false for a list never set: every project's apps may use the credential.
	AllowListSet bool `json:"allowListSet"`
	// AllowedProjects are the projects of a set list (empty when it allows none, or is unset).
	AllowedProjects []string `json:"allowedProjects"`
	// UsedBy are the projects whose apps name the credential (spec.git.credential).
	UsedBy []string `json:"usedBy"`
	// Denied are the projects of UsedBy the list leaves out: console-api refuses their apps the
	// credential.
	Denied []string `json:"denied"`
}

// ShowList is kip credentials list: each shared git credential with its allow-list and the
// projects whose apps use it, in three API requests (the credentials' metadata, the project
// namespaces, the apps).
func ShowList(ctx context.Context, o *Options) error {
	cl, err := o.Kube()
	if err != nil {
		return err
	}
	creds, err := List(ctx, cl)
	if err != nil {
		return err
	}
	refs, err := References(ctx, cl)
	if err != nil {
		return err
	}
	items := make([]Item, 0, len(creds))
	for _, c := range creds {
		it := Item{Name: c.Name, AllowListSet: c.Set, AllowedProjects: sortedUnique(c.Allowed), UsedBy: sortedUnique(refs[c.Name]), Denied: []string{}}
		for _, p := range it.UsedBy {
			if !c.Allows(p) {
				it.Denied = append(it.Denied, p)
			}
		}
		items = append(items, it)
	}
	if o.JSON {
		return cli.WriteJSON(o.Out, items)
	}
	rows := make([][]string, 0, len(items))
	for _, it := range items {
		used := strings.Join(it.UsedBy, ", ")
		if len(it.Denied) > 0 {
			used += " (not allowed: " + strings.Join(it.Denied, ", ") + ")"
		}
		rows = append(rows, []string{it.Name, describeAllowed(Credential{Set: it.AllowListSet, Allowed: it.AllowedProjects}), cli.OrDash(used)})
	}
	cli.WriteTable(o.Out, "Shared git credentials (Secrets in "+Namespace+" labelled "+Selector+")", "none: console-api creates them",
		[]string{"NAME", "ALLOWED PROJECTS", "USED BY"}, rows)
	return nil
}

// AllowOptions are kip credentials allow's: the credential and the projects to add to its
// allow-list.
type AllowOptions struct {
	Options
	Name     string
	Projects []string
}

// Allow is kip credentials allow: it adds projects to the allow-list of a shared git credential.
// A list never set is turned on by it, so every other project's apps lose the credential: kip
// says which projects' apps use it and are left out, and asks first (--yes answers). It refuses
// an unknown credential and a project that does not exist, and writes nothing when the list
// already holds every project. The write tests the resourceVersion kip read: a change made
// meanwhile fails it, and kip says to run the command again.
func Allow(ctx context.Context, o *AllowOptions) error {
	for _, p := range o.Projects {
		if p == "" || strings.ContainsAny(p, ", \t") {
			return cli.Usagef("%q is not a project name", p)
		}
	}
	cl, err := o.Kube()
	if err != nil {
		return err
	}
	creds, err := List(ctx, cl)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(creds, func(c Credential) bool { return c.Name == o.Name })
	if i < 0 {
		names := make([]string, 0, len(creds))
		for _, c := range creds {
			names = append(names, c.Name)
		}
		return fmt.Errorf("no shared git credential %s on this cluster (credentials: %s): list them with 'kip credentials list'",
			o.Name, cli.OrNone(strings.Join(names, ", ")))
	}
	c := creds[i]
	if err := checkProjects(ctx, cl, o.Projects); err != nil {
		return err
	}
	next := sortedUnique(append(slices.Clone(c.Allowed), o.Projects...))
	if c.Set && slices.Equal(next, sortedUnique(c.Allowed)) {
		o.Printer.StepAlready(fmt.Sprintf("Shared git credential %s already allows %s", c.Name, strings.Join(sortedUnique(o.Projects), ", ")))
		return nil
	}
	if !c.Set {
		if err := confirmTurnOn(ctx, o, cl, c, next); err != nil {
			return err
		}
	}
	err = writeAllowed(ctx, cl.Metadata, c, next)
	if errors.Is(err, errConflict) {
		return fmt.Errorf("allow projects %s to use shared git credential %s: %w, so nothing was written; run the command again to act on it as it is now",
			strings.Join(sortedUnique(o.Projects), ", "), c.Name, err)
	}
	if err != nil {
		return err
	}
	if c.Set {
		o.Printer.Success(fmt.Sprintf("Shared git credential %s allows %s (was %s)", c.Name, strings.Join(next, ", "), describeAllowed(c)))
	} else {
		o.Printer.Success(fmt.Sprintf("Shared git credential %s allows only %s now (its allow-list is on)", c.Name, strings.Join(next, ", ")))
	}
	return nil
}

// confirmTurnOn asks before the first allow-list of credential c, saying which projects' apps
// use it and lose it.
func confirmTurnOn(ctx context.Context, o *AllowOptions, cl *kube.Clients, c Credential, next []string) error {
	refs, err := References(ctx, cl)
	if err != nil {
		return err
	}
	var losing []string
	for _, p := range refs[c.Name] {
		if !slices.Contains(next, p) {
			losing = append(losing, p)
		}
	}
	o.Printer.Warn(fmt.Sprintf("Shared git credential %s has no allow-list: every project's apps may use it. This turns its allow-list on, "+
		"and from then on only the apps of %s may use it; every other project loses it", c.Name, strings.Join(next, ", ")))
	if len(losing) > 0 {
		o.Printer.Warn(fmt.Sprintf("Apps of %s use it and could no longer clone with it: add %s to this command to keep them",
			strings.Join(losing, ", "), cli.Plural(len(losing), "that project", "those projects")))
	}
	ok, err := o.Prompter.Confirm(fmt.Sprintf("Turn on the allow-list of shared git credential %s with %s?", c.Name, strings.Join(next, ", ")))
	if errors.Is(err, cli.ErrYesRequired) {
		return fmt.Errorf("turning on the allow-list of shared git credential %s needs confirmation: %w. Nothing was changed", c.Name, err)
	}
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("cancelled: nothing was changed")
	}
	return nil
}

// checkProjects refuses a project that does not exist (projects.kipper.run), with the names that
// do, in one request.
func checkProjects(ctx context.Context, cl *kube.Clients, projects []string) error {
	list, err := cl.Dynamic.Resource(service.ProjectsGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list Kipper projects: %w", err)
	}
	names := make([]string, 0, len(list.Items))
	for _, p := range list.Items {
		names = append(names, p.GetName())
	}
	slices.Sort(names)
	var missing []string
	for _, p := range sortedUnique(projects) {
		if !slices.Contains(names, p) {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("no Kipper %s %s on this cluster (projects: %s)", cli.Plural(len(missing), "project", "projects"),
			strings.Join(missing, ", "), cli.OrNone(strings.Join(names, ", ")))
	}
	return nil
}
