package status

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"kipper.run/kip/internal/kube"
)

// Traefik's copy of the hop certificate (spec 002, "Downgrading console-api"): on a *.kipper.run
// cluster Traefik serves the hop certificate from its own copy, which console-api keeps up to
// date. An older console-api does not, and when it rotates the hop key (in the certificate of
// Traefik's default TLSStore, which it does keep) the copy goes on serving the retired key until
// the gateway stops routing to the cluster.
const (
	hopCopyNamespace = "traefik"
	hopCopySecret    = "kipper-hop-cert"
)

// TLSStoresGVR is Traefik's TLSStore; the one named "default" holds the certificate Traefik
// serves by default.
var TLSStoresGVR = schema.GroupVersionResource{Group: "traefik.io", Version: "v1alpha1", Resource: "tlsstores"}

// hopCertCheck compares the key of Traefik's copy of the hop certificate with the key of the
// certificate of Traefik's default TLSStore; no check on a cluster without the copy. It compares
// the certificates' public keys, and never prints a key.
func hopCertCheck(ctx context.Context, c *kube.Clients) []Check {
	check := Check{Name: "hop certificate", Status: StatusOK}
	secrets := c.Kube.CoreV1().Secrets(hopCopyNamespace)
	cp, err := secrets.Get(ctx, hopCopySecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		check.Status, check.Detail = StatusWarn, fmt.Sprintf("read Traefik's copy of the hop certificate (%s/%s): %v", hopCopyNamespace, hopCopySecret, err)
		return []Check{check}
	}
	store, err := c.Dynamic.Resource(TLSStoresGVR).Namespace(hopCopyNamespace).Get(ctx, "default", metav1.GetOptions{})
	if err != nil {
		check.Status, check.Detail = StatusWarn, fmt.Sprintf("Traefik's default TLSStore (%s/default), which holds the hop certificate console-api keeps, cannot be read: %v", hopCopyNamespace, err)
		return []Check{check}
	}
	name, _, _ := unstructured.NestedString(store.Object, "spec", "defaultCertificate", "secretName")
	if name == "" {
		check.Status, check.Detail = StatusWarn, fmt.Sprintf("Traefik's default TLSStore (%s/default) names no certificate, so the hop certificate's copy cannot be compared with it", hopCopyNamespace)
		return []Check{check}
	}
	kept, err := secrets.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		check.Status, check.Detail = StatusWarn, fmt.Sprintf("read the hop certificate of Traefik's default TLSStore (%s/%s): %v", hopCopyNamespace, name, err)
		return []Check{check}
	}
	same, err := sameKey(cp, kept)
	switch {
	case err != nil:
		check.Status, check.Detail = StatusWarn, err.Error()
	case !same:
		check.Status = StatusWarn
		check.Detail = fmt.Sprintf("Traefik's copy of the hop certificate (%s/%s) holds a different key from the one in the certificate of Traefik's default TLSStore (%s/%s): "+
			"a console-api that does not keep the copy rotated the hop key, Traefik serves the retired one, and the cluster stops routing through the kipper.run gateway once its proof runs out",
			hopCopyNamespace, hopCopySecret, hopCopyNamespace, name)
		check.Fix = "once only the older console-api runs, remove the copy and restart Traefik as docs/upgrade.md shows (\"Downgrading console-api\"), or upgrade console-api to a version that keeps the copy"
	default:
		check.Detail = fmt.Sprintf("Traefik's copy of the hop certificate holds the key of the default TLSStore's (%s/%s)", hopCopyNamespace, name)
	}
	return []Check{check}
}

// sameKey reports whether two TLS Secrets' certificates hold the same public key.
func sameKey(a, b *corev1.Secret) (bool, error) {
	ka, err := publicKey(a)
	if err != nil {
		return false, err
	}
	kb, err := publicKey(b)
	if err != nil {
		return false, err
	}
	return bytes.Equal(ka, kb), nil
}

// publicKey is the DER public key of the first certificate in s's tls.crt.
func publicKey(s *corev1.Secret) ([]byte, error) {
	block, _ := pem.Decode(s.Data[corev1.TLSCertKey])
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("Secret " + s.Namespace + "/" + s.Name + " holds no PEM certificate in " + corev1.TLSCertKey)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("Secret %s/%s: %s: %w", s.Namespace, s.Name, corev1.TLSCertKey, err)
	}
	return x509.MarshalPKIXPublicKey(cert.PublicKey)
}
