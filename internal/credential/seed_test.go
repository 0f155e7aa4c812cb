package credential_test

import (
	"bytes"
	"reflect"
	"testing"

	"kipper.run/kip/internal/credential"
)

// TestSeeds: the seed grants each credential never set the projects whose apps use it, sorted
// and once each; it leaves a set list alone, even an empty one, and reports a credential no app
// uses as unused rather than turning its list on with no project.
func TestSeeds(t *testing.T) {
	unset := func(name string) credential.Credential { return credential.Credential{Name: name} }
	set := func(name string, allowed ...string) credential.Credential {
		return credential.Credential{Name: name, Set: true, Allowed: allowed}
	}
	for _, tc := range []struct {
		name   string
		creds  []credential.Credential
		refs   map[string][]string
		grants []credential.Grant
		unused []string
	}{
		{name: "no credentials", refs: map[string][]string{"gh": {"shop"}}},
		{name: "used by two projects, named unsorted and twice", creds: []credential.Credential{unset("gh")},
			refs:   map[string][]string{"gh": {"shop", "blog", "shop", ""}},
			grants: []credential.Grant{{Credential: "gh", Projects: []string{"blog", "shop"}}}},
		{name: "no app uses it", creds: []credential.Credential{unset("old")}, refs: map[string][]string{"gh": {"shop"}},
			unused: []string{"old"}},
		{name: "referenced by nothing but an empty project name", creds: []credential.Credential{unset("old")},
			refs: map[string][]string{"old": {""}}, unused: []string{"old"}},
		{name: "a set list, even empty, is never seeded", creds: []credential.Credential{set("gh", "shop"), set("empty")},
			refs: map[string][]string{"gh": {"blog"}, "empty": {"shop"}}},
		{name: "mixed, in the credentials' order",
			creds: []credential.Credential{unset("a"), set("b", "x"), unset("c"), unset("d")},
			refs:  map[string][]string{"a": {"p2", "p1"}, "b": {"p3"}, "d": {"p1"}, "missing": {"p9"}},
			grants: []credential.Grant{{Credential: "a", Projects: []string{"p1", "p2"}},
				{Credential: "d", Projects: []string{"p1"}}},
			unused: []string{"c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			grants, unused := credential.Seeds(tc.creds, tc.refs)
			if !reflect.DeepEqual(grants, tc.grants) || !reflect.DeepEqual(unused, tc.unused) {
				t.Errorf("Seeds = %+v, unused %q; want %+v, unused %q", grants, unused, tc.grants, tc.unused)
			}
		})
	}
}

// TestWriteSeeds: the check's lines for the seed, one grant and several, and the unused
// credentials; nothing when there is neither.
func TestWriteSeeds(t *testing.T) {
	for _, tc := range []struct {
		name   string
		grants []credential.Grant
		unused []string
		want   string
	}{
		{name: "nothing"},
		{name: "one grant", grants: []credential.Grant{{Credential: "gh", Projects: []string{"blog", "shop"}}},
			want: "  ·   This shared git credential has no allow-list yet: a cluster from before allow-lists,\n" +
				"      where every project's apps may use it. With consent (a prompt, or --seed-credential-grants),\n" +
				"      kip upgrade grants it the projects whose apps use it, and from then on only their apps may:\n" +
				"      - gh: blog, shop\n"},
		{name: "grants and unused",
			grants: []credential.Grant{{Credential: "gh", Projects: []string{"shop"}}, {Credential: "gl", Projects: []string{"blog"}}},
			unused: []string{"old", "spare"},
			want: "  ·   These 2 shared git credentials have no allow-list yet: a cluster from before allow-lists,\n" +
				"      where every project's apps may use them. With consent (a prompt, or --seed-credential-grants),\n" +
				"      kip upgrade grants each the projects whose apps use it, and from then on only their apps may:\n" +
				"      - gh: shop\n" +
				"      - gl: blog\n" +
				"  ·   No app uses the shared git credentials old, spare, so kip upgrade leaves them without an allow-list\n" +
				"      (every project may use them; 'kip credentials allow' sets one)\n"},
		{name: "one unused", unused: []string{"old"},
			want: "  ·   No app uses the shared git credential old, so kip upgrade leaves it without an allow-list\n" +
				"      (every project may use it; 'kip credentials allow' sets one)\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			credential.WriteSeeds(&b, tc.grants, tc.unused)
			if b.String() != tc.want {
				t.Errorf("WriteSeeds wrote\n%s\nwant\n%s", b.String(), tc.want)
			}
		})
	}
}

// TestAllowedAnnotation: the allow-list is read leniently and written sorted, unique, with no
// spaces.
func TestAllowedAnnotation(t *testing.T) {
	if got := credential.ParseAllowed(" shop, blog,,shop "); !reflect.DeepEqual(got, []string{"blog", "shop"}) {
		t.Errorf("ParseAllowed = %q", got)
	}
	if got := credential.ParseAllowed(""); len(got) != 0 {
		t.Errorf("ParseAllowed(\"\") = %q, want none", got)
	}
	if got := credential.FormatAllowed([]string{"shop", "blog", "shop", ""}); got != "blog,shop" {
		t.Errorf("FormatAllowed = %q", got)
	}
	if got := credential.FormatAllowed(nil); got != "" {
		t.Errorf("FormatAllowed(nil) = %q", got)
	}
}
