package main

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	storagev1ac "k8s.io/client-go/applyconfigurations/storage/v1"
	"k8s.io/client-go/kubernetes"
)

// k3s deploys its packaged manifests (server/manifests/*.yaml) with its deploy controller. Of
// local-storage.yaml the stand-in keeps only the StorageClass: there is no local-path
// provisioner to run.
const (
	localStorage = "local-storage" // the manifest's name, as `disable` names it
	localPathSC  = "local-path"
	// deployFieldManager is the stand-in's field manager for packaged manifests, after k3s's
	// deploy controller (ControllerName "deploy"), which applies them with wrangler instead.
	deployFieldManager = "deploy"
)

// deployLocalStorage applies the local-path StorageClass of k3s's local-storage manifest, on each
// start as k3s does: a change to it (say, is-default-class set to "false") is undone. When
// local-storage is disabled, it deletes the StorageClass if the stand-in applied it, as k3s
// removes a disabled component's objects.
func deployLocalStorage(ctx context.Context, kube kubernetes.Interface, disable []string) error {
	scs := kube.StorageV1().StorageClasses()
	if slices.Contains(disable, localStorage) {
		sc, err := scs.Get(ctx, localPathSC, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read storage class %s: %w", localPathSC, err)
		}
		if !slices.ContainsFunc(sc.ManagedFields, func(f metav1.ManagedFieldsEntry) bool { return f.Manager == deployFieldManager }) {
			return nil // not k3s's
		}
		if err := scs.Delete(ctx, localPathSC, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(sc.UID))}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("remove disabled %s: delete storage class %s: %w", localStorage, localPathSC, err)
		}
		return nil
	}
	sc := storagev1ac.StorageClass(localPathSC).
		WithAnnotations(map[string]string{
			"defaultVolumeType":                           "local",
			"storageclass.kubernetes.io/is-default-class": "true",
		}).
		WithProvisioner("rancher.io/local-path").
		WithVolumeBindingMode(storagev1.VolumeBindingWaitForFirstConsumer).
		WithReclaimPolicy(corev1.PersistentVolumeReclaimDelete)
	if _, err := scs.Apply(ctx, sc, metav1.ApplyOptions{FieldManager: deployFieldManager, Force: true}); err != nil {
		return fmt.Errorf("deploy %s: apply storage class %s: %w", localStorage, localPathSC, err)
	}
	return nil
}
