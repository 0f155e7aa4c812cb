package platform

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/workflow"
)

// CopiesOptions are kip cluster storage --max-copies's.
type CopiesOptions struct {
	Options
	MaxCopies int
}

// OfferCopies is kip cluster storage --max-copies 2: an admin offers two copies of a service's
// data, once. kip creates the class of two-copy data volumes and records the offer; deployers
// then choose one or two copies when they create a service (kip service add --copies 2).
// Existing services keep their storage as it is.
func OfferCopies(ctx context.Context, o *CopiesOptions) error {
	if o.MaxCopies < 1 || o.MaxCopies > cluster.MaxCopiesOffered {
		return cli.Usagef("--max-copies %d: Kipper keeps one or two copies of a service's data, so pass --max-copies 2 to offer two", o.MaxCopies)
	}
	pl, err := loadPlatform(ctx, o.Options)
	if err != nil {
		return err
	}
	switch offered := pl.rec.Copies(); {
	case o.MaxCopies == offered && offered == 1:
		pl.p.StepAlready("Services keep one copy of their data: offer two with 'kip cluster storage --max-copies 2'")
		return nil
	case o.MaxCopies < offered:
		return fmt.Errorf("two copies are already offered, and the offer is made once: services created with two copies keep them, so kip does not take it back")
	case pl.rec.Storage != cluster.StorageLonghorn:
		return fmt.Errorf("two copies of a service's data need Longhorn, and this cluster keeps its data on local storage: switch with 'kip cluster storage longhorn' first")
	}
	class, err := components.LonghornClass(2)
	if err != nil {
		return err
	}
	steps := []workflow.Step{{
		Name: "class", Title: "Create the class of two-copy data volumes (" + cluster.LonghornTwoCopiesClass + ")",
		Done: "Created the class " + cluster.LonghornTwoCopiesClass, Already: "The class " + cluster.LonghornTwoCopiesClass + " exists",
		Check: func(ctx context.Context) (bool, error) {
			sc, err := pl.cl.Kube.StorageV1().StorageClasses().Get(ctx, cluster.LonghornTwoCopiesClass, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			return err == nil && sc.Parameters["numberOfReplicas"] == "2", err
		},
		Apply: func(ctx context.Context) error {
			return kube.Apply(ctx, pl.cl, []*unstructured.Unstructured{class}, kube.ApplyOptions{})
		},
	}}
	if err := pl.run(ctx, "cluster-copies", steps, func(r *cluster.Record) { r.MaxCopies = o.MaxCopies }); err != nil {
		return err
	}
	pl.p.Success("Two copies of a service's data are offered")
	pl.p.Info("A deployer chooses them when creating a service, on two Ready nodes that can hold copies ('kip node list' shows them):")
	pl.p.Info("  kip service add TYPE --name NAME --project P --environment E --copies 2")
	pl.p.Info("Existing services keep their storage as it is; 'kip status' lists those whose copies are unset.")
	return nil
}
