package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"
)

// Records are kip's memory in the cluster: typed Go values stored as kipper.run/<name>
// annotations holding versioned JSON, {"version":N,"data":{...}}. A per-object record lives on
// its object (a Node, StatefulSet, PVC); cluster-wide records live on the ConfigMap that
// ClusterRecords names. docs/records.md documents the format and every record.

// RecordPrefix starts every record's annotation key.
const RecordPrefix = "kipper.run/"

// The cluster-wide record object.
const (
	RecordsNamespace = "kube-system"
	RecordsConfigMap = "kipper-records"
)

// ObjectRef names one object: its group, version and resource, and its key.
type ObjectRef struct {
	Group, Version, Resource string
	Namespace, Name          string
}

// ClusterRecords is the ConfigMap that holds kip's cluster-wide records. UpdateRecord creates it
// on the first write.
func ClusterRecords() ObjectRef { return ConfigMapRef(RecordsNamespace, RecordsConfigMap) }

// NodeRef names a Node.
func NodeRef(name string) ObjectRef {
	return ObjectRef{Version: "v1", Resource: "nodes", Name: name}
}

// ConfigMapRef names a ConfigMap.
func ConfigMapRef(namespace, name string) ObjectRef {
	return ObjectRef{Version: "v1", Resource: "configmaps", Namespace: namespace, Name: name}
}

// StatefulSetRef names a StatefulSet.
func StatefulSetRef(namespace, name string) ObjectRef {
	return ObjectRef{Group: "apps", Version: "v1", Resource: "statefulsets", Namespace: namespace, Name: name}
}

// PVCRef names a PersistentVolumeClaim.
func PVCRef(namespace, name string) ObjectRef {
	return ObjectRef{Version: "v1", Resource: "persistentvolumeclaims", Namespace: namespace, Name: name}
}

// GVR returns the object's group, version and resource.
func (r ObjectRef) GVR() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: r.Group, Version: r.Version, Resource: r.Resource}
}

// String names the object the way kubectl does, e.g. "nodes/w1" or
// "configmaps/kipper-records in kube-system".
func (r ObjectRef) String() string {
	s := r.Resource
	if r.Group != "" {
		s += "." + r.Group
	}
	s += "/" + r.Name
	if r.Namespace != "" {
		s += " in " + r.Namespace
	}
	return s
}

func (r ObjectRef) client(dyn dynamic.Interface) dynamic.ResourceInterface {
	c := dyn.Resource(r.GVR())
	if r.Namespace != "" {
		return c.Namespace(r.Namespace)
	}
	return c
}

// holdsOnlyRecords reports whether a missing object of this kind may be created just to hold
// records: kip creates ConfigMaps for that, never Nodes, StatefulSets or claims.
func (r ObjectRef) holdsOnlyRecords() bool {
	return r.Group == "" && r.Resource == "configmaps"
}

type envelope struct {
	Version int             `json:"version"`
	Data    json.RawMessage `json:"data"`
}

// ReadRecord reads record name from the object. A missing object or annotation is found=false.
// A record in an older format is decoded into T as it is (formats only add fields within one
// version); one written in a format newer than version is refused.
func ReadRecord[T any](ctx context.Context, dyn dynamic.Interface, ref ObjectRef, name string, version int) (rec T, found bool, err error) {
	obj, err := ref.client(dyn).Get(ctx, ref.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return rec, false, nil
	}
	if err != nil {
		return rec, false, fmt.Errorf("read record %s%s on %s: %w", RecordPrefix, name, ref, err)
	}
	raw, ok := obj.GetAnnotations()[RecordPrefix+name]
	if !ok {
		return rec, false, nil
	}
	rec, err = decodeRecord[T](ref, name, raw, version)
	return rec, err == nil, err
}

// ReadAnnotations reads the annotations of the object ref names, which hold its records, in one
// request: for a reader of several records on one object (RecordFrom decodes each). A missing
// object has none.
func ReadAnnotations(ctx context.Context, dyn dynamic.Interface, ref ObjectRef) (map[string]string, error) {
	obj, err := ref.client(dyn).Get(ctx, ref.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the records on %s: %w", ref, err)
	}
	return obj.GetAnnotations(), nil
}

// ReadRecords reads every record on the object whose name starts with prefix, keyed by name
// (without kipper.run/). A missing object holds none.
func ReadRecords[T any](ctx context.Context, dyn dynamic.Interface, ref ObjectRef, prefix string, version int) (map[string]T, error) {
	obj, err := ref.client(dyn).Get(ctx, ref.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read records %s%s* on %s: %w", RecordPrefix, prefix, ref, err)
	}
	recs := map[string]T{}
	for key, raw := range obj.GetAnnotations() {
		name, ok := strings.CutPrefix(key, RecordPrefix)
		if !ok || !strings.HasPrefix(name, prefix) {
			continue
		}
		rec, err := decodeRecord[T](ref, name, raw, version)
		if err != nil {
			return nil, err
		}
		recs[name] = rec
	}
	return recs, nil
}

// RecordAnnotation encodes rec as record name of format version: the annotation key and value
// to put on an object kip creates with its record already on it (a Velero Backup).
func RecordAnnotation(name string, version int, rec any) (key, value string, err error) {
	value, err = encodeRecord(version, rec)
	return RecordPrefix + name, value, err
}

// RecordFrom decodes record name from the annotations of the object ref names; found is false
// when it has none.
func RecordFrom[T any](ref ObjectRef, annotations map[string]string, name string, version int) (rec T, found bool, err error) {
	raw, ok := annotations[RecordPrefix+name]
	if !ok {
		return rec, false, nil
	}
	rec, err = decodeRecord[T](ref, name, raw, version)
	return rec, true, err
}

func decodeRecord[T any](ref ObjectRef, name, raw string, version int) (T, error) {
	var rec T
	var env envelope
	if err := json.Unmarshal([]byte(raw), &env); err != nil || env.Version < 1 {
		return rec, fmt.Errorf("record %s%s on %s is not a versioned kip record", RecordPrefix, name, ref)
	}
	if env.Version > version {
		return rec, fmt.Errorf("record %s%s on %s was written by a newer kip (format %d, this kip knows %d): upgrade kip",
			RecordPrefix, name, ref, env.Version, version)
	}
	if err := json.Unmarshal(env.Data, &rec); err != nil {
		return rec, fmt.Errorf("record %s%s on %s: decode format %d: %w", RecordPrefix, name, ref, env.Version, err)
	}
	return rec, nil
}

func encodeRecord(version int, rec any) (string, error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return "", err
	}
	raw, err := json.Marshal(envelope{Version: version, Data: data})
	return string(raw), err
}

// writeBackoff spaces out retries after a conflicting write. It is generous because a conflict
// means another writer just succeeded: with jitter, a crowd of writers spreads out and every
// one of them gets through.
var writeBackoff = wait.Backoff{Duration: 10 * time.Millisecond, Factor: 1.5, Jitter: 1, Steps: 20}

// retryWrite runs write until it neither conflicts with another writer nor loses a race to
// create the object.
func retryWrite(write func() error) error {
	return retry.OnError(writeBackoff, func(err error) bool {
		return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)
	}, write)
}

// UpdateRecord reads record name from the object, lets mutate change it (found says whether it
// existed; rec is the zero value when not), and writes it back in format version, guarded by
// the object's resourceVersion. When another writer got there first, it reads again and runs
// mutate again, so no concurrent update is lost: mutate must not have side effects. A missing
// ConfigMap is created to hold the record. An error from mutate is returned as it is, and
// nothing is written.
func UpdateRecord[T any](ctx context.Context, dyn dynamic.Interface, ref ObjectRef, name string, version int, mutate func(rec *T, found bool) error) (T, error) {
	key := RecordPrefix + name
	client := ref.client(dyn)
	var out T
	var finalErr error // ends the retries and is returned as it is: a bad record, or mutate's error
	err := retryWrite(func() error {
		obj, err := client.Get(ctx, ref.Name, metav1.GetOptions{})
		missing := apierrors.IsNotFound(err) && ref.holdsOnlyRecords()
		if err != nil && !missing {
			return err
		}
		var rec T
		var found bool
		old, ok := "", false
		if !missing {
			if old, ok = obj.GetAnnotations()[key]; ok {
				if rec, err = decodeRecord[T](ref, name, old, version); err != nil {
					finalErr = err
					return nil
				}
				found = true
			}
		}
		if err := mutate(&rec, found); err != nil {
			finalErr = err
			return nil
		}
		raw, err := encodeRecord(version, rec)
		if err != nil {
			return err
		}
		out = rec
		if missing {
			_, err = client.Create(ctx, newRecordsConfigMap(ref, key, raw), metav1.CreateOptions{})
			return err
		}
		if ok && old == raw {
			return nil
		}
		setAnnotation(obj, key, raw)
		_, err = client.Update(ctx, obj, metav1.UpdateOptions{})
		return err
	})
	if finalErr != nil {
		return out, finalErr
	}
	if err != nil {
		return out, fmt.Errorf("write record %s on %s: %w", key, ref, err)
	}
	return out, nil
}

// DeleteRecord removes record name from the object. A missing object or record is no error.
func DeleteRecord(ctx context.Context, dyn dynamic.Interface, ref ObjectRef, name string) error {
	key := RecordPrefix + name
	client := ref.client(dyn)
	err := retryWrite(func() error {
		obj, err := client.Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		annotations := obj.GetAnnotations()
		if _, ok := annotations[key]; !ok {
			return nil
		}
		delete(annotations, key)
		obj.SetAnnotations(annotations)
		_, err = client.Update(ctx, obj, metav1.UpdateOptions{})
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete record %s on %s: %w", key, ref, err)
	}
	return nil
}

func setAnnotation(obj *unstructured.Unstructured, key, value string) {
	annotations := obj.GetAnnotations()
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[key] = value
	obj.SetAnnotations(annotations)
}

func newRecordsConfigMap(ref ObjectRef, key, raw string) *unstructured.Unstructured {
	obj := &unstructured.Unstructured{}
	obj.SetAPIVersion("v1")
	obj.SetKind("ConfigMap")
	obj.SetNamespace(ref.Namespace)
	obj.SetName(ref.Name)
	obj.SetLabels(map[string]string{"app.kubernetes.io/managed-by": "kip"})
	obj.SetAnnotations(map[string]string{key: raw})
	return obj
}
