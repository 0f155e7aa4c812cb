package mover

import "sync"

// pool runs jobs on a fixed number of workers; a job may submit more. Submit never blocks, so a
// directory's job can queue its entries while every worker is busy.
type pool struct {
	mu     sync.Mutex
	cond   sync.Cond
	jobs   []func()
	active int
}

func newPool() *pool {
	p := &pool{}
	p.cond.L = &p.mu
	return p
}

// submit queues job.
func (p *pool) submit(job func()) {
	p.mu.Lock()
	p.jobs = append(p.jobs, job)
	p.mu.Unlock()
	p.cond.Signal()
}

// run works on the queue with n workers until it is empty and no job is running. Jobs are taken
// newest first, so a tree is walked depth first and the queue stays short.
func (p *pool) run(n int) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			for {
				for len(p.jobs) == 0 && p.active > 0 {
					p.cond.Wait()
				}
				if len(p.jobs) == 0 {
					p.cond.Broadcast()
					return
				}
				job := p.jobs[len(p.jobs)-1]
				p.jobs[len(p.jobs)-1] = nil
				p.jobs = p.jobs[:len(p.jobs)-1]
				p.active++
				p.mu.Unlock()
				job()
				p.mu.Lock()
				p.active--
				if p.active == 0 && len(p.jobs) == 0 {
					p.cond.Broadcast()
				}
			}
		})
	}
	wg.Wait()
}
