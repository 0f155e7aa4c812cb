package node

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/service"
)

// WorkerHost is the address kip reaches worker name at, as the operator gave it to kip node add;
// "" when kip keeps no record of that worker.
func WorkerHost(ctx context.Context, cl *kube.Clients, name string) (string, error) {
	workers, err := ReadNodes(ctx, cl.Dynamic)
	if err != nil {
		return "", err
	}
	return workers.Workers[name].Host, nil
}

// ServiceWorker is kip's record of worker name as service commands need it: its address, and
// whether a fence holds it, from the fence's first step until a rejoin finishes, whatever the
// node's taint says.
func ServiceWorker(ctx context.Context, cl *kube.Clients, name string) (service.WorkerRecord, error) {
	workers, err := ReadNodes(ctx, cl.Dynamic)
	if err != nil {
		return service.WorkerRecord{}, err
	}
	w := workers.Workers[name]
	r := service.WorkerRecord{Host: w.Host, Fenced: w.Fence != nil}
	if w.Fence != nil {
		r.CutOff = w.Fence.CutOff
	}
	return r, nil
}

// CopyHolders are the nodes that can hold a copy of a service's data now, server first: each
// Ready node that may hold copies (the server always; a worker kip recorded ready whose disk
// passed the disk check or was accepted with --ignore-slow-disk). A fenced node is never Ready.
func CopyHolders(ctx context.Context, cl *kube.Clients) ([]string, error) {
	nodes, err := cl.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	workers, err := ReadNodes(ctx, cl.Dynamic)
	if err != nil {
		return nil, err
	}
	var holders []string
	for _, l := range listed(cluster.Record{}, workers, nodes.Items) {
		if l.Status == cluster.NodeReady && (l.Role == cluster.RoleServer || l.State == WorkerReady) &&
			mayHoldCopies(l.Copies) {
			holders = append(holders, l.Name)
		}
	}
	return holders, nil
}
