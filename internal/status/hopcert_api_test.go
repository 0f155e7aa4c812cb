package status

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/test/testenv"
)

// TestHopCertCheck runs kip doctor's check of Traefik's copy of the hop certificate against a
// real API server: no check without a copy; a copy holding the key of the default TLSStore's
// certificate passes; once that certificate is renewed with a new key (as an older console-api
// rotating the hop key does) while the copy stays, the check warns with the recovery, and
// prints no key. Traefik's TLSStore CRD is a permissive stand-in (Traefik's own CRDs are not in
// kip's module graph).
func TestHopCertCheck(t *testing.T) {
	env := testenv.Get(t)
	c, err := kube.NewClients(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if got := hopCertCheck(ctx, c); got != nil {
		t.Fatalf("a cluster without the copy: %+v", got)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "tlsstores.traefik.io"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "traefik.io", Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: "TLSStore", ListKind: "TLSStoreList", Plural: "tlsstores", Singular: "tlsstore"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1alpha1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptr.To(true)}}}},
		},
	}
	if _, err := c.APIExt.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := kube.WaitCRDsEstablished(ctx, c, []string{crd.Name}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: hopCopyNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	secrets := c.Kube.CoreV1().Secrets(hopCopyNamespace)
	cert, key := tlsPair(t)
	for _, name := range []string{"hop-cert", hopCopySecret} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, Type: corev1.SecretTypeTLS, Data: map[string][]byte{corev1.TLSCertKey: cert, corev1.TLSPrivateKeyKey: key}}
		if _, err := secrets.Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { secrets.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	}
	store := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "traefik.io/v1alpha1", "kind": "TLSStore",
		"metadata": map[string]any{"name": "default", "namespace": hopCopyNamespace},
		"spec":     map[string]any{"defaultCertificate": map[string]any{"secretName": "hop-cert"}}}}
	if _, err := c.Dynamic.Resource(TLSStoresGVR).Namespace(hopCopyNamespace).Create(ctx, store, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Dynamic.Resource(TLSStoresGVR).Namespace(hopCopyNamespace).Delete(context.Background(), "default", metav1.DeleteOptions{})
	})
	if got := hopCertCheck(ctx, c); len(got) != 1 || got[0].Status != StatusOK || !strings.Contains(got[0].Detail, "holds the key of the default TLSStore's (traefik/hop-cert)") {
		t.Errorf("a copy of the same key: %+v", got)
	}

	// The older console-api rotates the hop key: the TLSStore's certificate moves, the copy stays.
	cert2, key2 := tlsPair(t)
	rotated := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "hop-cert"}, Type: corev1.SecretTypeTLS, Data: map[string][]byte{corev1.TLSCertKey: cert2, corev1.TLSPrivateKeyKey: key2}}
	if _, err := secrets.Update(ctx, rotated, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	got := hopCertCheck(ctx, c)
	if len(got) != 1 || got[0].Status != StatusWarn || !strings.Contains(got[0].Detail, "Traefik's copy of the hop certificate (traefik/kipper-hop-cert) holds a different key") ||
		!strings.Contains(got[0].Fix, `docs/upgrade.md shows ("Downgrading console-api")`) {
		t.Errorf("a copy of a retired key: %+v", got)
	}
	for _, k := range [][]byte{key, key2} {
		if strings.Contains(got[0].Detail+got[0].Fix, string(k)) {
			t.Error("the check printed a key")
		}
	}
}

// tlsPair is a new self-signed certificate and its key, PEM-encoded.
func tlsPair(t *testing.T) (cert, key []byte) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "hop.shop.kipper.run"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}
