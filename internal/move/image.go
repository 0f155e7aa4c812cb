package move

import (
	"context"
	"fmt"
	"time"

	"kipper.run/kip/internal/cluster"
)

// deliver puts the mover's image on the move's node before this run's first mover pod: the
// pods never pull it (moverpod.Deliver). A worker is reached at the address kip recorded for it,
// the server at the cluster's.
func (m *mv) deliver(ctx context.Context) error {
	if m.delivered {
		return nil
	}
	host, err := cluster.WorkerHost(ctx, m.cl, m.in.Node)
	if err != nil {
		return err
	}
	if host == "" {
		if host, err = m.rec.ServerHost(m.o.Server); err != nil {
			return err
		}
	}
	start := time.Now()
	imported, err := m.o.Deliver(ctx, host)
	if err != nil {
		return fmt.Errorf("put the data mover's image on node %s (%s): %w", m.in.Node, host, err)
	}
	if imported {
		m.o.Printer.StepDone("Imported the data mover's image on node "+m.in.Node, time.Since(start))
	} else {
		m.o.Printer.StepAlready("The data mover's image is on node " + m.in.Node)
	}
	m.delivered = true
	return nil
}
