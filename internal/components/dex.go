package components

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/bcrypt"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"kipper.run/kip/internal/kube"
)

// What kip install applies, as data: Components lists the components of a cluster in install order,
// each with the objects kip server-side applies on every run, the objects it only ever creates, the
// objects it applies once the component is ready, and a readiness check. docs/components.md is the
// operator's view of this file.
//
// Most components are Helm charts that k3s's embedded helm-controller installs from a
// helm.cattle.io/v1 HelmChart in kube-system; kip's own objects (CRDs, namespaces, RBAC, the
// console) are plain manifests.

// dex is Dex, at https://dex.<ip>.sslip.io: the console's and kip's login. Its config keeps the
// static users of ExistingDexConfig (those the console added) and the console's client secret, and
// adds the initial admin when the config does not know that email yet.
func (r *renderer) dex() (Component, error) {
	clientSecret := existingClientSecret(r.dexConfig, consoleClientID)
	if clientSecret == "" {
		var err error
		if clientSecret, err = randomToken(32); err != nil {
			return Component{}, err
		}
	}
	users := existingUsers(r.dexConfig)
	if r.o.AdminEmail != "" && !hasUser(users, r.o.AdminEmail) {
		if usesHashFromEnv(users, adminHashEnv) {
			// The first admin's password hash comes from the environment; a second admin given
			// the same way would log in with the first one's password.
			return Component{}, fmt.Errorf("the console already has its first admin: add %s in the console instead", r.o.AdminEmail)
		}
		id, err := randomToken(16)
		if err != nil {
			return Component{}, err
		}
		users = append(users, map[string]any{
			"email":       r.o.AdminEmail,
			"username":    strings.SplitN(r.o.AdminEmail, "@", 2)[0],
			"userID":      id,
			"hashFromEnv": adminHashEnv,
		})
	}
	config := map[string]any{
		"issuer":  "https://" + r.dexHost,
		"storage": map[string]any{"type": "kubernetes", "config": map[string]any{"inCluster": true}},
		"web":     map[string]any{"http": "0.0.0.0:5556"},
		// ID tokens are short-lived: the API server accepts them as credentials and a bearer token
		// cannot be revoked; the console and kip renew through rotating refresh tokens.
		"expiry": map[string]any{
			"idTokens":     "15m",
			"authRequests": "10m",
			"refreshTokens": map[string]any{
				"reuseInterval":     "30s",
				"validIfNotUsedFor": "168h",
				"absoluteLifetime":  "720h",
			},
		},
		"oauth2":           map[string]any{"skipApprovalScreen": true},
		"enablePasswordDB": true,
		"staticPasswords":  users,
		"staticClients": []any{
			map[string]any{
				"id": consoleClientID, "name": "Kipper Console", "secret": clientSecret,
				"redirectURIs": []any{"https://" + r.consoleHost + "/callback"},
			},
			// A public client without redirect URIs: Dex lets it return to any loopback port, and
			// use the device flow.
			map[string]any{"id": cliClientID, "name": "kip", "public": true},
		},
	}
	configYAML, err := yaml.Marshal(config)
	if err != nil {
		return Component{}, fmt.Errorf("render dex config: %w", err)
	}
	sum := sha256.Sum256(configYAML)
	values := map[string]any{
		"configSecret":   map[string]any{"create": false, "name": dexConfigSecret},
		"podAnnotations": map[string]any{configHashAnnotation: hex.EncodeToString(sum[:])},
		"ingress": map[string]any{
			"enabled":     true,
			"className":   ingressClass,
			"annotations": map[string]any{"cert-manager.io/cluster-issuer": clusterIssuer},
			"hosts": []any{map[string]any{"host": r.dexHost, "paths": []any{
				map[string]any{"path": "/", "pathType": "Prefix"},
			}}},
			"tls": []any{map[string]any{"secretName": "dex-tls", "hosts": []any{r.dexHost}}},
		},
	}
	// A user whose hash comes from the environment takes it from the admin password Secret, which
	// kip creates once: its password and the hash Dex checks always match.
	adminFromEnv := usesHashFromEnv(users, adminHashEnv)
	if adminFromEnv {
		values["envVars"] = []any{map[string]any{
			"name": adminHashEnv,
			"valueFrom": map[string]any{"secretKeyRef": map[string]any{
				"name": adminPasswordSecret, "key": "hash",
			}},
		}}
	}
	c, err := r.chartComponent("dex", dexNamespace, values,
		typed("v1", "Secret", &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: dexConfigSecret, Namespace: dexNamespace},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{dexConfigKey: configYAML},
		}),
		// console-api's copy of its client secret (kipper-base makes kipper-system).
		typed("v1", "Secret", &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: dexOIDCClientSecret, Namespace: systemNamespace},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{"secret": []byte(clientSecret)},
		}),
	)
	if err != nil {
		return Component{}, err
	}
	if adminFromEnv && r.o.AdminEmail != "" {
		password, err := randomPassword(20)
		if err != nil {
			return Component{}, err
		}
		hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
		if err != nil {
			return Component{}, fmt.Errorf("hash the admin password: %w", err)
		}
		err = collect(&c.CreateOnly, typed("v1", "Secret", &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: adminPasswordSecret, Namespace: dexNamespace},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{"email": []byte(r.o.AdminEmail), "password": []byte(password), "hash": hash},
		}))
		if err != nil {
			return Component{}, err
		}
	}
	return c, nil
}

// ReadDexConfig returns the Dex config kip rendered into the cluster (config.yaml of the Secret
// dex/dex-config), or nil when there is none yet.
func ReadDexConfig(ctx context.Context, cl *kube.Clients) ([]byte, error) {
	s, err := cl.Kube.CoreV1().Secrets(dexNamespace).Get(ctx, dexConfigSecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the dex config: %w", err)
	}
	config, ok := s.Data[dexConfigKey]
	if !ok {
		return nil, fmt.Errorf("read the dex config: Secret %s/%s has no %s", dexNamespace, dexConfigSecret, dexConfigKey)
	}
	return config, nil
}

// DexUsers returns the emails of the static users (staticPasswords) of a Dex config, in order.
func DexUsers(config []byte) ([]string, error) {
	m, err := parseDexConfig(config)
	if err != nil {
		return nil, fmt.Errorf("dex users: %w", err)
	}
	var emails []string
	for _, u := range existingUsers(m) {
		if e, _ := u["email"].(string); e != "" {
			emails = append(emails, e)
		}
	}
	return emails, nil
}

// parseDexConfig reads a Dex config loosely: only its static users and clients matter here. Its
// errors never quote the config, which holds password hashes and a client secret.
func parseDexConfig(config []byte) (map[string]any, error) {
	var m map[string]any
	if err := yaml.Unmarshal(config, &m); err != nil {
		return nil, errors.New("not a YAML document")
	}
	if m == nil {
		return nil, errors.New("empty")
	}
	for _, key := range []string{"staticPasswords", "staticClients"} {
		v, ok := m[key]
		if !ok || v == nil {
			continue
		}
		list, ok := v.([]any)
		if !ok {
			return nil, fmt.Errorf("%s is not a list", key)
		}
		for i, it := range list {
			if _, ok := it.(map[string]any); !ok {
				return nil, fmt.Errorf("%s entry %d is not a mapping", key, i+1)
			}
		}
	}
	return m, nil
}

func existingUsers(config map[string]any) []map[string]any {
	list, _ := config["staticPasswords"].([]any)
	users := make([]map[string]any, 0, len(list))
	for _, it := range list {
		users = append(users, it.(map[string]any)) // parseDexConfig checked the type
	}
	return users
}

func existingClientSecret(config map[string]any, id string) string {
	list, _ := config["staticClients"].([]any)
	for _, it := range list {
		c := it.(map[string]any)
		if c["id"] == id {
			s, _ := c["secret"].(string)
			return s
		}
	}
	return ""
}

func hasUser(users []map[string]any, email string) bool {
	for _, u := range users {
		if e, _ := u["email"].(string); strings.EqualFold(e, email) {
			return true
		}
	}
	return false
}

func usesHashFromEnv(users []map[string]any, env string) bool {
	for _, u := range users {
		if u["hashFromEnv"] == env {
			return true
		}
	}
	return false
}
