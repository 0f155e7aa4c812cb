package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	lh "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/test/longhorn-standin/manager"
)

// defaultEngineImage is the engine image new volumes get: the default-engine-image setting the
// manager records, else the newest release's (no stand-in manager runs).
func (s *store) defaultEngineImage(ctx context.Context) (string, error) {
	image, err := manager.SettingValue(ctx, s.lh, manager.SettingDefaultEngineImage)
	if err != nil || image != "" {
		return image, err
	}
	return manager.Newest.EngineImage(), nil
}

// instanceManager is the instance manager an engine starting on node runs in: the node's of the
// default instance manager image, which must be running (errBusy otherwise: the volume stays
// attaching, as Longhorn's does); "" when no stand-in manager runs.
func (s *store) instanceManager(ctx context.Context, node string) (string, error) {
	image, err := manager.SettingValue(ctx, s.lh, manager.SettingDefaultIMImage)
	if err != nil || image == "" {
		return "", err
	}
	name := manager.InstanceManagerName(node, image)
	im, err := s.lh.LonghornV1beta2().InstanceManagers(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", fmt.Errorf("%w: node %s has no instance manager of %s yet", errBusy, node, image)
	}
	if err != nil {
		return "", err
	}
	if im.Status.CurrentState != lh.InstanceManagerStateRunning {
		return "", fmt.Errorf("%w: instance manager %s on node %s is %s", errBusy, name, node, im.Status.CurrentState)
	}
	return name, nil
}

// upgradeEngines moves volumes onto the engine image their spec names, as Longhorn's volume
// controller does (LM controller/volume_controller.go upgradeEngineForVolume): a detached volume
// at once (offline), an attached one only while it is healthy and its engine's controller API is
// one the new engine drives (live; LM engine_image_controller.go canDoLiveEngineImageUpgrade),
// its engine staying in the instance manager it runs in. A degraded or faulted attached volume
// keeps its engine. With concurrent-automatic-engine-upgrade-per-node-limit above 0 (0 by
// default), it first points every volume that could move at the default engine image, as
// Longhorn's automatic engine upgrade does; otherwise only a volume whose spec.image someone
// changed moves. The controller's.
func (s *store) upgradeEngines(ctx context.Context, vols []lh.Volume) error {
	limit, err := manager.SettingValue(ctx, s.lh, manager.SettingAutoUpgradeLimit)
	if err != nil {
		return err
	}
	auto, _ := strconv.Atoi(limit)
	def, err := s.defaultEngineImage(ctx)
	if err != nil {
		return err
	}
	images, err := s.lh.LonghornV1beta2().EngineImages(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	byImage := map[string]*lh.EngineImage{}
	for i := range images.Items {
		byImage[images.Items[i].Spec.Image] = &images.Items[i]
	}
	var errs []error
	for i := range vols {
		v := &vols[i]
		if auto > 0 && v.Spec.Image != def && v.Status.CurrentImage != def && canMove(v, byImage[v.Status.CurrentImage], byImage[def]) {
			v.Spec.Image = def
			if v, err = s.volumes().Update(ctx, v, metav1.UpdateOptions{}); err != nil {
				errs = append(errs, ignoreConflict(err))
				continue
			}
		}
		if v.Spec.Image == v.Status.CurrentImage || !canMove(v, byImage[v.Status.CurrentImage], byImage[v.Spec.Image]) {
			continue
		}
		errs = append(errs, s.moveEngine(ctx, v))
	}
	return errors.Join(errs...)
}

// canMove reports whether Longhorn would move v from engine image from to to now: detached, or
// attached, healthy and on a controller API that to drives; to must be deployed.
func canMove(v *lh.Volume, from, to *lh.EngineImage) bool {
	if to == nil || to.Status.State != lh.EngineImageStateDeployed {
		return false
	}
	switch v.Status.State {
	case lh.VolumeStateDetached:
		return true
	case lh.VolumeStateAttached:
		return v.Status.Robustness == lh.VolumeRobustnessHealthy && from != nil &&
			from.Status.ControllerAPIVersion <= to.Status.ControllerAPIVersion && from.Status.ControllerAPIVersion >= to.Status.ControllerAPIMinVersion
	}
	return false
}

// moveEngine puts v's engine and copies on its spec's image, then the volume: its currentImage
// follows last, so a reader never sees the volume moved before its engine.
func (s *store) moveEngine(ctx context.Context, v *lh.Volume) error {
	api := s.lh.LonghornV1beta2()
	image := v.Spec.Image
	e, err := api.Engines(namespace).Get(ctx, engineName(v.Name), metav1.GetOptions{})
	if err != nil {
		return err
	}
	if e.Spec.Image != image {
		e.Spec.Image = image
		if e, err = api.Engines(namespace).Update(ctx, e, metav1.UpdateOptions{}); err != nil {
			return ignoreConflict(err)
		}
	}
	if e.Status.CurrentImage != image {
		e.Status.CurrentImage = image
		if _, err = api.Engines(namespace).UpdateStatus(ctx, e, metav1.UpdateOptions{}); err != nil {
			return ignoreConflict(err)
		}
	}
	reps, err := s.replicas(ctx, v.Name)
	if err != nil {
		return err
	}
	for _, r := range reps {
		if r.Spec.Image == image && r.Status.CurrentImage == image {
			continue
		}
		if _, err := s.updateReplica(ctx, r.Name, func(r *lh.Replica) { r.Spec.Image = image }, func(r *lh.Replica) { r.Status.CurrentImage = image }); err != nil {
			return err
		}
	}
	return s.setState(ctx, v.Name, func(v *lh.Volume) { v.Status.CurrentImage = image })
}
