package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	lh "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	lhclient "github.com/longhorn/longhorn-manager/k8s/pkg/client/clientset/versioned"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// Setting is one of Longhorn's settings the stand-in creates with its default: those kip pins,
// the two the replica scheduler reads, the one that lets Longhorn move volumes onto a new engine
// by itself, and the instance managers' CPU share. DataEngine marks a data-engine-specific
// setting, a JSON object keyed by data engine from 1.10 on.
type Setting struct {
	Name, Default string
	DataEngine    bool
}

// The settings the stand-in's objects follow.
const (
	SettingCurrentVersion       = "current-longhorn-version"
	SettingDefaultEngineImage   = "default-engine-image"
	SettingDefaultIMImage       = "default-instance-manager-image"
	SettingManagerCPU           = "guaranteed-instance-manager-cpu"
	SettingAutoUpgradeLimit     = "concurrent-automatic-engine-upgrade-per-node-limit"
	SettingMinimalAvailable     = "storage-minimal-available-percentage"
	SettingOverProvisioning     = "storage-over-provisioning-percentage"
	SettingFastReplicaRebuild   = "fast-replica-rebuild-enabled"
	settingDefaultReplicaCount  = "default-replica-count"
	settingUpgradeChecker       = "upgrade-checker"
	settingUsageMetrics         = "allow-collecting-longhorn-usage-metrics"
	settingNodeDrainPolicy      = "node-drain-policy"
	settingDataLocality         = "default-data-locality"
	settingReplicaAutoBalance   = "replica-auto-balance"
	settingRWXFastFailover      = "rwx-volume-fast-failover"
	settingNodeDownPodDeletion  = "node-down-pod-deletion-policy"
	settingDegradedAvailability = "allow-volume-creation-with-degraded-availability"
)

// Settings are the settings with their defaults in every release of the ladder.
var Settings = []Setting{
	{settingUpgradeChecker, "true", false},
	{settingUsageMetrics, "true", false},
	{SettingFastReplicaRebuild, "true", true},
	{settingNodeDrainPolicy, "block-if-contains-last-replica", false},
	{settingDataLocality, "disabled", false},
	{settingReplicaAutoBalance, "disabled", false},
	{settingRWXFastFailover, "false", false},
	{settingNodeDownPodDeletion, "do-nothing", false},
	{settingDegradedAvailability, "true", false},
	{SettingManagerCPU, "12", true},
	{settingDefaultReplicaCount, "3", true},
	{SettingAutoUpgradeLimit, "0", false},
	{SettingMinimalAvailable, "25", false},
	{SettingOverProvisioning, "100", false},
}

// FindSetting is the setting named name, false for one the stand-in does not create.
func FindSetting(name string) (Setting, bool) {
	for _, s := range Settings {
		if s.Name == name {
			return s, true
		}
	}
	return Setting{}, false
}

// Value is a value of s as release r holds it: a data-engine-specific setting's plain value
// becomes its JSON object from 1.10 on (PerEngine); other values are kept.
func (r Release) Value(s Setting, value string) string {
	if !s.DataEngine || !r.PerEngine {
		return value
	}
	return PerEngine(value)
}

// PerEngine is what Longhorn's setting mutator (and 1.10's upgrade of the settings) makes of a
// plain value of a data-engine-specific setting: the value for each data engine, as JSON (keys
// sorted by json.Marshal). A value that is already a JSON object is kept.
func PerEngine(value string) string {
	if strings.HasPrefix(strings.TrimSpace(value), "{") {
		return value
	}
	b, _ := json.Marshal(map[string]string{string(lh.DataEngineTypeV1): value, string(lh.DataEngineTypeV2): value})
	return string(b)
}

// EnsureSettings creates the settings r's manager creates that do not exist yet, with r's
// defaults, and from 1.10 on rewrites a plain value of a data-engine-specific setting as its
// JSON object, as the upgrade to 1.10 does.
func EnsureSettings(ctx context.Context, c lhclient.Interface, r Release) error {
	api := c.LonghornV1beta2().Settings(Namespace)
	var errs []error
	for _, s := range Settings {
		obj := &lh.Setting{ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: Namespace}, Value: r.Value(s, s.Default)}
		_, err := api.Create(ctx, obj, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) && s.DataEngine && r.PerEngine {
			err = SetSetting(ctx, c, s.Name, func(v string) string { return PerEngine(v) })
		} else if apierrors.IsAlreadyExists(err) {
			err = nil
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("setting %s: %w", s.Name, err))
		}
	}
	return errors.Join(errs...)
}

// SetSetting changes setting name's value with change (creating it from ""), again on a
// conflict; a value change leaves unchanged is not written.
func SetSetting(ctx context.Context, c lhclient.Interface, name string, change func(string) string) error {
	api := c.LonghornV1beta2().Settings(Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		st, err := api.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = api.Create(ctx, &lh.Setting{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace}, Value: change("")}, metav1.CreateOptions{})
			return err
		}
		if err != nil {
			return err
		}
		if v := change(st.Value); v != st.Value {
			st.Value = v
			_, err = api.Update(ctx, st, metav1.UpdateOptions{})
		}
		return err
	})
}

// SettingValue is setting name's value, "" when it does not exist.
func SettingValue(ctx context.Context, c lhclient.Interface, name string) (string, error) {
	st, err := c.LonghornV1beta2().Settings(Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return st.Value, nil
}

// Running is the release the cluster's manager recorded (current-longhorn-version), Newest when
// none did: a lab cluster without the stand-in's manager pods.
func Running(ctx context.Context, c lhclient.Interface) (Release, error) {
	v, err := SettingValue(ctx, c, SettingCurrentVersion)
	if err != nil || v == "" {
		return Newest, err
	}
	return Find(v)
}
