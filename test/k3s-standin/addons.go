package main

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"kipper.run/kip/test/helmstandin"
)

// k3s deploys its packaged manifests (server/manifests/*.yaml) with its deploy controller, on
// every start, undoing changes; a disabled one's objects are deleted. The stand-in deploys two
// of them, k3s's CoreDNS and local-path provisioner, from manifests/.
const (
	// deployFieldManager is the stand-in's field manager for packaged manifests, after k3s's
	// deploy controller (ControllerName "deploy"), which applies them with wrangler instead.
	deployFieldManager = "deploy"
	// defaultLocalStoragePath is k3s's default-local-storage-path.
	defaultLocalStoragePath = "/var/lib/rancher/k3s/storage"
)

//go:embed manifests/*.yaml
var packaged embed.FS

// packagedManifests are the manifests the stand-in deploys, by the name `disable` gives them.
var packagedManifests = []string{"coredns", "local-storage"}

// manifestObjects reads a packaged manifest with k3s's %{…}% variables filled in.
func manifestObjects(name string, vars map[string]string) ([]*unstructured.Unstructured, error) {
	data, err := packaged.ReadFile("manifests/" + name + ".yaml")
	if err != nil {
		return nil, err
	}
	text := string(data)
	for k, v := range vars {
		text = strings.ReplaceAll(text, "%{"+k+"}%", v)
	}
	return helmstandin.DecodeObjects(bytes.NewReader([]byte(text)))
}

// deployPackaged applies each packaged manifest, or deletes the objects of a disabled one that
// the stand-in applied (its managed fields show the deploy manager), as k3s does.
func deployPackaged(ctx context.Context, a *helmstandin.Applier, disable []string, vars map[string]string) error {
	for _, name := range packagedManifests {
		objs, err := manifestObjects(name, vars)
		if err != nil {
			return fmt.Errorf("packaged manifest %s: %w", name, err)
		}
		for _, o := range objs {
			if !slices.Contains(disable, name) {
				if err := a.Apply(ctx, o, "kube-system", deployFieldManager); err != nil {
					return fmt.Errorf("deploy %s: %w", name, err)
				}
				continue
			}
			if err := deleteDeployed(ctx, a, o); err != nil {
				return fmt.Errorf("remove disabled %s: %w", name, err)
			}
		}
	}
	return nil
}

func deleteDeployed(ctx context.Context, a *helmstandin.Applier, o *unstructured.Unstructured) error {
	res, err := a.Resource(o, "kube-system")
	if err != nil {
		return err
	}
	cur, err := res.Get(ctx, o.GetName(), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s %s: %w", o.GetKind(), o.GetName(), err)
	}
	if !slices.ContainsFunc(cur.GetManagedFields(), func(f metav1.ManagedFieldsEntry) bool { return f.Manager == deployFieldManager }) {
		return nil // not k3s's
	}
	uid := cur.GetUID()
	if err := res.Delete(ctx, o.GetName(), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete %s %s: %w", o.GetKind(), o.GetName(), err)
	}
	return nil
}
