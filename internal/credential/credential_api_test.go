package credential_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"kipper.run/kip/internal/app"
	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/credential"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/internal/workflow"
	"kipper.run/kip/test/testenv"
)

// secretValue is the data of every credential the tests make: it must never reach kip's output.
const secretValue = "ghp_never-printed-token"

// suffix makes this run's names unique in the shared environment.
func suffix(t *testing.T) string {
	t.Helper()
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func clients(t *testing.T) (*testenv.Env, *kube.Clients) {
	t.Helper()
	env := testenv.Get(t)
	cl, err := kube.NewClients(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: credential.Namespace}}
	if _, err := cl.Kube.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return env, cl
}

// addSecret creates Secret name in kipper-system, as console-api creates a shared git credential
// (labelled unless plain), with allowed as its allow-list when not nil; it goes at the test's end.
func addSecret(t *testing.T, cl *kube.Clients, name string, plain bool, allowed *string) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: credential.Namespace},
		StringData: map[string]string{"username": "x-access-token", "password": secretValue}}
	if !plain {
		s.Labels = map[string]string{credential.Label: "true"}
	}
	if allowed != nil {
		s.Annotations = map[string]string{credential.AllowedAnnotation: *allowed}
	}
	if _, err := cl.Kube.CoreV1().Secrets(credential.Namespace).Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cl.Kube.CoreV1().Secrets(credential.Namespace).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// annotation reads credential name's allow-list as stored: its value, and whether it is there.
func annotation(t *testing.T, cl *kube.Clients, name string) (string, bool) {
	t.Helper()
	s, err := cl.Kube.CoreV1().Secrets(credential.Namespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v, ok := s.Annotations[credential.AllowedAnnotation]
	return v, ok
}

func setAnnotation(t *testing.T, cl *kube.Clients, name, value string) {
	t.Helper()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{credential.AllowedAnnotation: value}}})
	if _, err := cl.Kube.CoreV1().Secrets(credential.Namespace).Patch(context.Background(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// mine keeps the credentials of creds whose names end with sfx: the test's own.
func mine(creds []credential.Credential, sfx string) map[string]credential.Credential {
	out := map[string]credential.Credential{}
	for _, c := range creds {
		if strings.HasSuffix(c.Name, sfx) {
			out[strings.TrimSuffix(c.Name, "-"+sfx)] = c
		}
	}
	return out
}

func ptr(s string) *string { return &s }

// TestList reads the shared git credentials in one request, as metadata: the labelled Secrets
// of kipper-system only, each with its allow-list as set (read leniently) or never set.
func TestList(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env, cl := clients(t)
	sfx := suffix(t)
	addSecret(t, cl, "unset-"+sfx, false, nil)
	addSecret(t, cl, "set-"+sfx, false, ptr(" shop,blog,,shop"))
	addSecret(t, cl, "empty-"+sfx, false, ptr(""))
	addSecret(t, cl, "plain-"+sfx, true, nil)

	counted, log := testenv.CountingClients(t, env.Config)
	log.Take()
	creds, err := credential.List(ctx, counted)
	if err != nil {
		t.Fatal(err)
	}
	if n, paths := log.Take(); n != 1 {
		t.Errorf("List made %d requests, want 1:\n%s", n, strings.Join(paths, "\n"))
	}
	got := mine(creds, sfx)
	if len(got) != 3 {
		t.Fatalf("List found %d of the test's credentials, want 3 (the unlabelled Secret left out): %+v", len(got), got)
	}
	if c := got["unset"]; c.Set || len(c.Allowed) != 0 || c.ResourceVersion == "" {
		t.Errorf("unset: %+v", c)
	}
	if c := got["set"]; !c.Set || strings.Join(c.Allowed, ",") != "blog,shop" || !c.Allows("shop") || c.Allows("other") {
		t.Errorf("set: %+v", c)
	}
	if c := got["empty"]; !c.Set || len(c.Allowed) != 0 || c.Allows("shop") {
		t.Errorf("empty: %+v", c)
	}
	if !got["unset"].Allows("anyone") {
		t.Errorf("a list never set allows every project")
	}
}

// TestSeedStep runs the upgrade's seed step against the real API server as a resumed run finds
// it: one grant already written (as by a run killed right after that write), one credential's
// list set meanwhile by someone else, one credential deleted since the check; the step writes
// the rest, leaves those alone, and its check then reports it done. A dry run plans only what is
// left to write.
func TestSeedStep(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, cl := clients(t)
	sfx := suffix(t)
	name := func(n string) string { return n + "-" + sfx }
	for _, n := range []string{"done", "todo", "meanwhile", "unused"} {
		addSecret(t, cl, name(n), false, nil)
	}
	creds, err := credential.List(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	refs := map[string][]string{name("done"): {"shop"}, name("todo"): {"shop", "blog"}, name("meanwhile"): {"blog"}, name("gone"): {"shop"}}
	grants, unused := credential.Seeds(creds, refs)
	var mineGrants []credential.Grant
	for _, g := range grants {
		if strings.HasSuffix(g.Credential, sfx) {
			mineGrants = append(mineGrants, g)
		}
	}
	if len(mineGrants) != 3 || !strings.Contains(strings.Join(unused, " "), name("unused")) {
		t.Fatalf("Seeds: %+v, unused %q", mineGrants, unused)
	}
	// The credential deleted since the check: granted, then gone.
	addSecret(t, cl, name("gone"), false, nil)
	mineGrants = append(mineGrants, credential.Grant{Credential: name("gone"), Projects: []string{"shop"}})
	if err := cl.Kube.CoreV1().Secrets(credential.Namespace).Delete(ctx, name("gone"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	setAnnotation(t, cl, name("done"), "shop")
	setAnnotation(t, cl, name("meanwhile"), "other")

	var out bytes.Buffer
	ios := &cli.IOStreams{Out: &out, ErrOut: &out, Getenv: func(string) string { return "" }}
	p := cli.NewPrinter(ios)
	step := credential.SeedStep(cl, mineGrants, p)
	wf := &workflow.Workflow{Name: "credential-seed-test", Steps: []workflow.Step{step}}

	// A dry run: only the credential still unset is to change.
	if err := (&workflow.Runner{Report: p, DryRun: true}).Run(ctx, wf); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); !strings.Contains(s, "allow-list of "+name("todo")+": never set → blog,shop") || strings.Contains(s, name("meanwhile")+": never set") {
		t.Errorf("the dry run planned:\n%s", s)
	}
	out.Reset()

	if err := (&workflow.Runner{Report: p}).Run(ctx, wf); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for n, want := range map[string]string{"done": "shop", "todo": "blog,shop", "meanwhile": "other"} {
		if v, ok := annotation(t, cl, name(n)); !ok || v != want {
			t.Errorf("%s: allow-list %q (set %v), want %q", n, v, ok, want)
		}
	}
	if _, ok := annotation(t, cl, name("unused")); ok {
		t.Errorf("the unused credential got an allow-list")
	}
	if done, err := step.Check(ctx); err != nil || !done {
		t.Errorf("the step's check after the run: %v, %v", done, err)
	}
	if s := out.String(); !strings.Contains(s, "Shared git credential "+name("todo")+": allowed for blog, shop") || strings.Contains(s, secretValue) {
		t.Errorf("the run reported:\n%s", s)
	}

	// Run again: nothing left to write.
	out.Reset()
	if err := (&workflow.Runner{Report: p}).Run(ctx, wf); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); !strings.Contains(s, "Every shared git credential granted has an allow-list") {
		t.Errorf("the second run reported:\n%s", s)
	}
}

// TestSeedConflict: a grant written against a resourceVersion that is no longer the Secret's is
// refused by the API server; kip reads the credential again, writes it at the new version while
// its list is still unset, and leaves it alone once someone set it.
func TestSeedConflict(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, cl := clients(t)
	sfx := suffix(t)
	a, b := "rotated-"+sfx, "taken-"+sfx
	addSecret(t, cl, a, false, nil)
	addSecret(t, cl, b, false, nil)
	read, err := credential.List(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	stale := mine(read, sfx)
	// console-api rotates a's data (its list stays unset); someone sets b's list.
	patch := []byte(`{"stringData":{"password":"rotated"}}`)
	if _, err := cl.Kube.CoreV1().Secrets(credential.Namespace).Patch(ctx, a, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	setAnnotation(t, cl, b, "blog")

	left, err := credential.Seed(ctx, cl, stale["rotated"], credential.Grant{Credential: a, Projects: []string{"shop"}})
	if err != nil || left != "" {
		t.Errorf("seed of the rotated credential: left %q, %v", left, err)
	}
	if v, ok := annotation(t, cl, a); !ok || v != "shop" {
		t.Errorf("the rotated credential's allow-list: %q (set %v), want shop", v, ok)
	}
	left, err = credential.Seed(ctx, cl, stale["taken"], credential.Grant{Credential: b, Projects: []string{"shop"}})
	if err != nil || !strings.Contains(left, "its allow-list was set meanwhile (blog)") {
		t.Errorf("seed of the credential set meanwhile: left %q, %v", left, err)
	}
	if v, _ := annotation(t, cl, b); v != "blog" {
		t.Errorf("the list set meanwhile became %q", v)
	}
}

// project creates Kipper project p with environment prod's namespace (labelled as console-api
// labels it), and in it the apps named, each using credential cred.
func project(ctx context.Context, t *testing.T, cl *kube.Clients, p, cred string, apps ...string) {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Project",
		"metadata": map[string]any{"name": p}, "spec": map[string]any{"environments": []any{map[string]any{"name": "prod"}}}}}
	if _, err := cl.Dynamic.Resource(service.ProjectsGVR).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: p + "-prod", Labels: map[string]string{service.ProjectLabel: p}}}
	if _, err := cl.Kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = cl.Dynamic.Resource(service.ProjectsGVR).Delete(ctx, p, metav1.DeleteOptions{})
		_ = cl.Kube.CoreV1().Namespaces().Delete(ctx, p+"-prod", metav1.DeleteOptions{})
	})
	for _, a := range apps {
		obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "App",
			"metadata": map[string]any{"name": a, "namespace": p + "-prod"},
			"spec":     map[string]any{"image": "registry.example/" + a, "git": map[string]any{"url": "https://git.example/" + a, "credential": cred}}}}
		if _, err := cl.Dynamic.Resource(app.AppsGVR).Namespace(p+"-prod").Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

type cmdFixture struct {
	out, errOut *bytes.Buffer
	opts        func(yes bool) credential.Options
}

func commands(cl *kube.Clients, json bool) *cmdFixture {
	f := &cmdFixture{out: &bytes.Buffer{}, errOut: &bytes.Buffer{}}
	f.opts = func(yes bool) credential.Options {
		ios := &cli.IOStreams{In: strings.NewReader(""), Out: f.out, ErrOut: f.errOut, Getenv: func(string) string { return "" }}
		return credential.Options{Kube: func() (*kube.Clients, error) { return cl, nil }, Printer: cli.NewPrinter(ios),
			Prompter: cli.NewPrompter(ios, yes), JSON: json, Out: f.out}
	}
	return f
}

// TestAllowAndList drives kip credentials allow and list against the real API server: the
// refusals (an unknown credential, a project that does not exist, turning a list on without a
// terminal or --yes), the first allow turning the list on with --yes and naming the project whose
// apps lose the credential, a later allow adding a project without asking, no write when nothing
// changes, and the list in text and JSON. The credential's data never shows.
func TestAllowAndList(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env, cl := clients(t)
	sfx := suffix(t)
	cred, other := "gh-"+sfx, "spare-"+sfx
	shop, blog := "shop-"+sfx, "blog-"+sfx
	addSecret(t, cl, cred, false, nil)
	addSecret(t, cl, other, false, ptr(""))
	project(ctx, t, cl, shop, cred, "web", "api")
	project(ctx, t, cl, blog, cred, "site")

	f := commands(cl, false)
	allow := func(yes bool, name string, projects ...string) error {
		return credential.Allow(ctx, &credential.AllowOptions{Options: f.opts(yes), Name: name, Projects: projects})
	}
	if err := allow(true, "nope-"+sfx, shop); err == nil || !strings.Contains(err.Error(), "no shared git credential nope-"+sfx) ||
		!strings.Contains(err.Error(), "'kip credentials list'") || !strings.Contains(err.Error(), cred) {
		t.Errorf("an unknown credential: %v", err)
	}
	if err := allow(true, cred, shop, "ghost-"+sfx); err == nil || !strings.Contains(err.Error(), "no Kipper project ghost-"+sfx) || !strings.Contains(err.Error(), shop) {
		t.Errorf("a project that does not exist: %v", err)
	}
	if err := allow(false, cred, shop); cli.ExitCode(err) != cli.ExitUsage || !strings.Contains(err.Error(), "--yes is required") ||
		!strings.Contains(err.Error(), "Nothing was changed") {
		t.Errorf("turning the list on without a terminal or --yes: %v (exit %d)", err, cli.ExitCode(err))
	}
	if err := allow(false, cred, "a,b"); cli.ExitCode(err) != cli.ExitUsage {
		t.Errorf("a project name with a comma: %v", err)
	}
	if _, ok := annotation(t, cl, cred); ok {
		t.Fatalf("a refused allow wrote the allow-list")
	}

	f.errOut.Reset()
	if err := allow(true, cred, shop); err != nil {
		t.Fatal(err)
	}
	if v, ok := annotation(t, cl, cred); !ok || v != shop {
		t.Errorf("after allow: %q (set %v), want %s", v, ok, shop)
	}
	msgs := f.errOut.String()
	for _, want := range []string{"This turns its allow-list on", "Apps of " + blog + " use it and could no longer clone with it",
		"[y/N] yes (--yes)", "allows only " + shop + " now"} {
		if !strings.Contains(msgs, want) {
			t.Errorf("allow's messages lack %q:\n%s", want, msgs)
		}
	}

	// The list is on: adding a project asks nothing, even without a terminal.
	f.errOut.Reset()
	if err := allow(false, cred, blog); err != nil {
		t.Fatal(err)
	}
	if v, _ := annotation(t, cl, cred); v != strings.Join(sortedPair(shop, blog), ",") {
		t.Errorf("after the second allow: %q", v)
	}
	// Nothing to add: no write.
	before, _ := cl.Kube.CoreV1().Secrets(credential.Namespace).Get(ctx, cred, metav1.GetOptions{})
	f.errOut.Reset()
	if err := allow(false, cred, blog, shop); err != nil {
		t.Fatal(err)
	}
	after, _ := cl.Kube.CoreV1().Secrets(credential.Namespace).Get(ctx, cred, metav1.GetOptions{})
	if before.ResourceVersion != after.ResourceVersion || !strings.Contains(f.errOut.String(), "already allows") {
		t.Errorf("an allow with nothing to add wrote (%s → %s):\n%s", before.ResourceVersion, after.ResourceVersion, f.errOut.String())
	}
	// Someone takes blog off the list again: the list shows blog's apps left out.
	setAnnotation(t, cl, cred, shop)

	// kip credentials list, in three requests.
	counted, log := testenv.CountingClients(t, env.Config)
	f = commands(counted, false)
	log.Take()
	o := f.opts(false)
	if err := credential.ShowList(ctx, &o); err != nil {
		t.Fatal(err)
	}
	if n, paths := log.Take(); n != 3 {
		t.Errorf("kip credentials list made %d requests, want 3:\n%s", n, strings.Join(paths, "\n"))
	}
	text := f.out.String()
	for _, want := range []string{"NAME", "ALLOWED PROJECTS", "USED BY", cred, blog + ", " + shop + " (not allowed: " + blog + ")", other, "no project"} {
		if !strings.Contains(text, want) {
			t.Errorf("kip credentials list lacks %q:\n%s", want, text)
		}
	}
	f = commands(cl, true)
	o = f.opts(false)
	if err := credential.ShowList(ctx, &o); err != nil {
		t.Fatal(err)
	}
	var items []credential.Item
	if err := json.Unmarshal(f.out.Bytes(), &items); err != nil {
		t.Fatalf("%v:\n%s", err, f.out.String())
	}
	found := 0
	for _, it := range items {
		switch it.Name {
		case cred:
			found++
			if !it.AllowListSet || strings.Join(it.AllowedProjects, ",") != shop || strings.Join(it.UsedBy, ",") != strings.Join(sortedPair(shop, blog), ",") ||
				strings.Join(it.Denied, ",") != blog {
				t.Errorf("list -o json, %s: %+v", cred, it)
			}
		case other:
			found++
			if !it.AllowListSet || len(it.AllowedProjects) != 0 || len(it.UsedBy) != 0 {
				t.Errorf("list -o json, %s: %+v", other, it)
			}
		}
	}
	if found != 2 {
		t.Errorf("list -o json lacks the test's credentials:\n%s", f.out.String())
	}
	if strings.Contains(f.out.String(), secretValue) || strings.Contains(text, secretValue) || strings.Contains(msgs, secretValue) {
		t.Errorf("a credential's data was printed")
	}
}

func sortedPair(a, b string) []string {
	if b < a {
		return []string{b, a}
	}
	return []string{a, b}
}
