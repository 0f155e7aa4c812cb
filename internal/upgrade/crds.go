package upgrade

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/mod/semver"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/manifests"
)

// CheckCRDs applies the two guards of spec 002 before the Kipper schemas move, both refusing
// before anything is written: objects stored under an API version this kip's schemas do not
// declare (applying would strand them), and schemas last written by a newer kip (the marker on
// the App CRD). A kip built from source cannot be ordered against a release, so it skips the
// second guard and says so in skipped.
func CheckCRDs(ctx context.Context, cl *kube.Clients, kipVersion string) (skipped string, err error) {
	docs, err := manifests.CRDs()
	if err != nil {
		return "", err
	}
	// One request, however many schemas kip declares.
	list, err := cl.APIExt.ApiextensionsV1().CustomResourceDefinitions().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("list the CRDs: %w", err)
	}
	live := map[string]*apiextensionsv1.CustomResourceDefinition{}
	for i := range list.Items {
		live[list.Items[i].Name] = &list.Items[i]
	}
	var stranded []string
	for _, doc := range docs {
		var want apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(doc, &want); err != nil {
			return "", fmt.Errorf("read kip's Kipper schemas: %w", err)
		}
		have, ok := live[want.Name]
		if !ok {
			continue
		}
		declared := make([]string, 0, len(want.Spec.Versions))
		for _, v := range want.Spec.Versions {
			declared = append(declared, v.Name)
		}
		for _, v := range have.Status.StoredVersions {
			if !slices.Contains(declared, v) {
				stranded = append(stranded, fmt.Sprintf("%s stores objects as %s, which this kip's schema does not declare (it declares %s)", want.Name, v, strings.Join(declared, ", ")))
			}
		}
		if want.Name != components.AppCRD {
			continue
		}
		marker := have.Annotations[components.KipVersionAnnotation]
		switch {
		case !Release(kipVersion):
			skipped = fmt.Sprintf("this kip was built from source (version %s), which cannot be ordered against a release: "+
				"the check that no newer kip wrote the Kipper schemas was skipped", kipVersion)
		case marker != "" && Release(marker) && semver.Compare(marker, kipVersion) > 0:
			return "", fmt.Errorf("the Kipper schemas were last written by kip %s, newer than this kip (%s): applying them would replace them with older ones "+
				"and prune what %s added. Nothing was changed: upgrade kip to %s or later, then run it again", marker, kipVersion, marker, marker)
		}
	}
	if len(stranded) > 0 {
		return "", fmt.Errorf("the cluster holds Kipper objects stored under an API version this kip does not declare, and applying its schemas would strand them: %s. "+
			"Nothing was changed: upgrade kip to a release that declares them, then run it again", strings.Join(stranded, "; "))
	}
	return skipped, nil
}

// Release reports whether v is a released kip's version (v1.2.3), one a version can be
// ordered against; a build from source reports "dev" or a git description (v1.2.3-4-gabc).
func Release(v string) bool {
	return semver.IsValid(v) && semver.Prerelease(v) == "" && semver.Build(v) == ""
}
