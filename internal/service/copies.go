package service

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
)

// Types are the kinds of service kip service add creates.
var Types = []string{"postgres", "mysql", "redis", "minio"}

// AddOptions is kip service add.
type AddOptions struct {
	Options
	Ref
	Type string
	// Copies is how many copies of its data the service keeps: 1, or 2 once offered.
	Copies int
	// Storage is the declared size of its data volume, "" for console-api's default.
	Storage string
}

// Add is kip service add: it writes a new Service with its type, copies and class, and waits until
// console-api runs it. Two copies need the admin's offer (kip cluster storage --max-copies 2) and
// two Ready nodes that can hold copies.
func Add(ctx context.Context, o *AddOptions) error {
	if !slices.Contains(Types, o.Type) {
		return cli.Usagef("unknown service type %q: choose %s", o.Type, strings.Join(Types, ", "))
	}
	if errs := validation.IsDNS1035Label(o.Name); len(errs) > 0 {
		return cli.Usagef("--name %q: %s", o.Name, strings.Join(errs, "; "))
	}
	if o.Copies < 1 || o.Copies > cluster.MaxCopiesOffered {
		return cli.Usagef("--copies %d: a service keeps one or two copies of its data", o.Copies)
	}
	if o.Storage != "" {
		if _, err := storageSize(o.Storage); err != nil {
			return err
		}
	}
	cl, err := o.Kube()
	if err != nil {
		return err
	}
	rec, err := cluster.ReadInstalled(ctx, cl.Dynamic)
	if err != nil {
		return err
	}
	if err := CheckEnvironment(ctx, cl.Dynamic, o.Project, o.Environment); err != nil {
		return err
	}
	services := cl.Dynamic.Resource(ServicesGVR).Namespace(o.Namespace())
	if _, err := services.Get(ctx, o.Name, metav1.GetOptions{}); err == nil {
		return fmt.Errorf("service %s already exists: see it with 'kip service info %s'", o.Ref, o.Flags())
	} else if !apierrors.IsNotFound(err) {
		return fmt.Errorf("read service %s: %w", o.Ref, err)
	}
	if o.Copies > rec.Copies() {
		return fmt.Errorf("this cluster offers one copy of a service's data: an admin offers two with 'kip cluster storage --max-copies 2'")
	}
	if o.Copies == 2 {
		holders, err := cluster.CopyHolders(ctx, cl)
		if err != nil {
			return err
		}
		if len(holders) < 2 {
			return fmt.Errorf("two copies need two Ready nodes that can hold copies, and %s: %s", holdersNow(holders), moreHolders)
		}
	}
	// On Longhorn, each volume gets its class: console-api puts the data volume of a service with
	// two copies in the two-copy class, and the dump volume always keeps one copy.
	spec := map[string]any{"type": o.Type, "copies": int64(o.Copies)}
	if rec.Storage == cluster.StorageLonghorn {
		spec["storageClass"] = cluster.LonghornOneCopyClass
	}
	if o.Storage != "" {
		spec["storage"] = o.Storage
	}
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": ServicesGVR.GroupVersion().String(), "kind": "Service",
		"metadata": map[string]any{"name": o.Name, "namespace": o.Namespace()}, "spec": spec}}
	start := time.Now()
	o.Printer.StepStarted(fmt.Sprintf("Adding %s service %s with %s", o.Type, o.Ref, copiesText(o.Copies)))
	if _, err := services.Create(ctx, u, metav1.CreateOptions{FieldManager: kube.FieldManager}); err != nil {
		return fmt.Errorf("create service %s: %w", o.Ref, err)
	}
	if err := WaitRunning(ctx, cl.Dynamic, cl.Kube, o.Ref, StartTimeout); err != nil {
		return fmt.Errorf("%w; the service was created: 'kip service info %s' shows where it stands", err, o.Flags())
	}
	o.Printer.StepDone(fmt.Sprintf("Service %s runs, with %s", o.Ref, copiesText(o.Copies)), time.Since(start))
	return nil
}

// moreHolders says how a cluster gets another node that can hold copies.
const moreHolders = "join a worker with 'kip node add HOST', or check a joined worker's disk with 'kip node storage WORKER --copies' ('kip node list' shows which nodes can hold copies)"

func holdersNow(holders []string) string {
	if len(holders) == 0 {
		return "no node can now"
	}
	return "only " + strings.Join(holders, ", ") + " can now"
}

func copiesText(n int) string {
	if n == 1 {
		return "one copy of its data"
	}
	return fmt.Sprintf("%d copies of its data", n)
}

// recordCopies is kip service update --copies N on a service whose copies are unset: it records
// the number of copies Longhorn keeps of its data volume (one for a local volume). Changing the
// number is not available.
func recordCopies(ctx context.Context, cl *kube.Clients, s *Service, n int) (string, error) {
	if n < 1 || n > cluster.MaxCopiesOffered {
		return "", cli.Usagef("--copies %d: a service keeps one or two copies of its data", n)
	}
	switch s.Copies {
	case n:
		return fmt.Sprintf("copies %d (already recorded)", n), nil
	case 0:
	default:
		return "", fmt.Errorf("service %s keeps %s: changing the number of copies of an existing service is not available yet", s.Ref, copiesText(s.Copies))
	}
	v, err := volumeAt(ctx, cl, s.Namespace(), s.DataClaim())
	if err != nil {
		return "", err
	}
	kept := v.kept()
	if kept == 0 {
		return "", fmt.Errorf("service %s has no data volume yet (claim %s: %s): record its copies once it has one", s.Ref, v.Claim, v.Phase)
	}
	if kept != n {
		return "", fmt.Errorf("Longhorn keeps %s of service %s: record that with --copies %d; changing the number of copies of an existing service is not available yet",
			copiesText(kept), s.Ref, kept)
	}
	return fmt.Sprintf("copies (unset) → %d", n), nil
}

// copiesInfo fills what kip service info says of the service's copies: a service whose copies
// are unset gets the command that records them; one with two copies whose data volume is not
// created yet, why it waits.
func (o *ServiceOptions) copiesInfo(ctx context.Context, cl *kube.Clients, s *Service, info *Info) error {
	data := info.Volumes[0]
	switch {
	case s.Copies == 0 && data.Volume != "":
		kept := data.kept()
		info.CopiesNote = fmt.Sprintf("unset (%s kept); record them with 'kip service update %s --copies %d'", copiesText(kept), s.Flags(), kept)
	case s.Copies == 0:
		info.CopiesNote = "unset; record them with 'kip service update " + s.Flags() + " --copies N' once its data volume exists"
	case s.Copies == 2 && data.Volume == "":
		holders, err := cluster.CopyHolders(ctx, cl)
		if err != nil {
			return err
		}
		if len(holders) < 2 {
			info.CopiesNote = fmt.Sprintf("creation of its data volume waits for two Ready nodes that can hold copies, and %s: %s", holdersNow(holders), moreHolders)
		}
	}
	return nil
}
