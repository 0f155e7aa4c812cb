package standin

import (
	"bytes"
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/test/longhorn-standin/manager"
	"kipper.run/kip/test/testenv"
)

// v1beta1Kinds are the kinds whose CRDs listed longhorn.io/v1beta1 up to Longhorn 1.9 (15 of
// 1.10's 22: the kinds Longhorn had before v1beta2).
var v1beta1Kinds = []string{"BackingImage", "BackingImageDataSource", "BackingImageManager", "Backup", "BackupTarget",
	"BackupVolume", "Engine", "EngineImage", "InstanceManager", "Node", "RecurringJob", "Replica", "Setting",
	"ShareManager", "Volume"}

// ReleaseCRDs returns Longhorn's CRDs as release (one of manager.Releases) installs them,
// derived from the v1.10.0 CRDs of the longhorn-manager module (testenv.LonghornCRDs): labelled
// with the release's version, and, for the kinds that had it, longhorn.io/v1beta1 listed as the
// release lists it — served but not the storage version up to 1.8, listed but not served in 1.9,
// gone from 1.10 (research/upgrade-facts.md). The v1beta1 schema is the one those releases
// ship: spec and status kept whatever they hold. So objects still stored as v1beta1 (a CRD whose
// status.storedVersions lists it) make the API server refuse 1.10's CRDs, as on a real cluster.
// Fields the releases added after 1.7 are not removed: kip reads none of them.
func ReleaseCRDs(release string) ([]byte, error) {
	r, err := manager.Find(release)
	if err != nil {
		return nil, err
	}
	base, err := testenv.LonghornCRDs()
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	for _, doc := range bytes.Split(base, []byte("\n---")) {
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(doc, &crd); err != nil {
			return nil, fmt.Errorf("Longhorn's CRDs: %w", err)
		}
		if crd.Name == "" {
			continue // the file's leading comment
		}
		if crd.Labels == nil {
			crd.Labels = map[string]string{}
		}
		crd.Labels["app.kubernetes.io/version"] = release
		if r.V1beta1 != "" && slices.Contains(v1beta1Kinds, crd.Spec.Names.Kind) {
			crd.Spec.Versions = append([]apiextensionsv1.CustomResourceDefinitionVersion{v1beta1(r.V1beta1 == manager.V1beta1Served)}, crd.Spec.Versions...)
		}
		data, err := yaml.Marshal(&crd)
		if err != nil {
			return nil, err
		}
		out.WriteString("---\n")
		out.Write(data)
	}
	return out.Bytes(), nil
}

// v1beta1 is the v1beta1 version of a Longhorn CRD before 1.10: never the storage version, its
// spec and status whatever they hold.
func v1beta1(served bool) apiextensionsv1.CustomResourceDefinitionVersion {
	keep := apiextensionsv1.JSONSchemaProps{XPreserveUnknownFields: ptr.To(true)}
	return apiextensionsv1.CustomResourceDefinitionVersion{
		Name: "v1beta1", Served: served, Storage: false,
		Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
			Type: "object",
			Properties: map[string]apiextensionsv1.JSONSchemaProps{
				"apiVersion": {Type: "string"}, "kind": {Type: "string"}, "metadata": {Type: "object"},
				"spec": keep, "status": keep,
			},
		}},
		Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
	}
}

// ApplyRelease applies release's CRDs (ReleaseCRDs) as Longhorn's chart does, server-side, and
// makes Longhorn's namespace: what the tests of the stand-in against the test control plane
// start from.
func ApplyRelease(ctx context.Context, cl *kube.Clients, release string) error {
	data, err := ReleaseCRDs(release)
	if err != nil {
		return err
	}
	objs, err := kube.DecodeManifests(data)
	if err != nil {
		return err
	}
	if err := kube.Apply(ctx, cl, objs, kube.ApplyOptions{FieldManager: "longhorn-chart", Force: true}); err != nil {
		return fmt.Errorf("Longhorn %s's CRDs: %w", release, err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}
	if _, err := cl.Kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}
