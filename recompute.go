package chameleon

import (
	"fmt"

	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// Recompute in the executor: a tensor the policy drops loses its device
// memory after its last use before a gap, and before the op that needs it
// the Engine makes the producer's inputs resident, allocates the tensor
// again under the same handle and runs the producer's Recompute. A chain
// (an input that is itself dropped) is made first. Inputs stay on the
// device until the recompute has run, even when the host releases them
// first: the plan counted them held.

// rcLive is one planned recompute in the current iteration.
type rcLive struct {
	x   *Tensor      // the tensor, matched when its producer made it
	in  []*Tensor    // the producer's inputs, held until the recompute
	fn  func() error // the producer's Recompute
	ran bool         // made again (or abandoned) this iteration
}

// captured reports whether the recompute can run: its tensor matched at its
// producer, which handed the Engine a way to run again.
func (r *rcLive) captured() bool { return r.x != nil && r.fn != nil }

// capture records, after op i, what the recomputes of the tensors it made
// need: the op's inputs (held from now) and its Recompute.
func (p *policy) capture(i int, op *Op) {
	for _, k := range p.prodAt[i] {
		r := &p.rlive[k]
		if r.x == nil || op.Recompute == nil || r.fn != nil {
			continue
		}
		r.fn = op.Recompute
		r.in = append(r.in[:0], op.In...)
		for _, t := range r.in {
			t.holds++
		}
	}
}

// drop releases, after op i, the device memory of the tensors the policy
// drops there.
func (it *Iteration) drop(p *policy, i int) error {
	e := it.eng
	for _, k := range p.dropAt[i] {
		r := &p.rlive[k]
		x := r.x
		if !r.captured() || r.ran || x.released || x.state != resident {
			continue
		}
		if err := e.alloc.FreeOn(x.ptr, e.compute); err != nil {
			return fmt.Errorf("chameleon: drop tensor %d: %w", x.id, err)
		}
		x.ptr, x.state = 0, dropped
		it.drops++
	}
	return nil
}

// recompute makes the dropped tensor of recompute k again, its dropped
// inputs first.
func (it *Iteration) recompute(p *policy, k int32) error {
	e := it.eng
	r := &p.rlive[k]
	x := r.x
	if x.state != dropped {
		return nil
	}
	if !r.captured() || r.ran {
		return fmt.Errorf("chameleon: tensor %d was dropped and cannot be made again", x.id)
	}
	x.pin = e.serial
	for _, t := range r.in {
		t.pin = e.serial
	}
	for _, t := range r.in {
		switch {
		case t.state == dropped && t.rc >= 0:
			if err := it.recompute(p, t.rc); err != nil {
				return err
			}
		case t.state == swapped:
			if _, err := e.swapIn(t, true); err != nil {
				return err
			}
			it.onDemand++
			e.stats.OnDemandIn++
		}
		if t.state == swappedIn {
			if err := e.dev.StreamWait(e.compute, t.ready); err != nil {
				return err
			}
			t.state = resident
		}
	}
	ptr, err := e.allocate(x.size, e.compute)
	if err != nil {
		return fmt.Errorf("chameleon: recompute tensor %d: %w", x.id, err)
	}
	x.ptr, x.state = ptr, resident
	if err := r.fn(); err != nil {
		return fmt.Errorf("chameleon: recompute tensor %d: %w", x.id, err)
	}
	it.recomputes++
	e.stats.Recomputes++
	return p.finish(e, k)
}

// finish ends recompute k: its inputs are held no longer.
func (p *policy) finish(e *Engine, k int32) error {
	r := &p.rlive[k]
	if r.ran {
		return nil
	}
	r.ran = true
	var err error
	for _, t := range r.in {
		if t.holds--; t.holds == 0 && t.released {
			if ferr := e.free(t); err == nil {
				err = ferr
			}
		}
	}
	r.in = r.in[:0]
	return err
}

// abandon ends recompute k without running it (its tensor was released).
func (p *policy) abandon(e *Engine, k int32) { _ = p.finish(e, k) }

// settle, at the end of an iteration, makes again what is still dropped
// and lets go of every hold: nothing waits across iterations.
func (it *Iteration) settle(p *policy) error {
	for k := range p.rlive {
		r := &p.rlive[k]
		if r.x != nil && r.x.state == dropped && !r.x.released {
			if err := it.recompute(p, int32(k)); err != nil {
				return err
			}
		}
		if err := p.finish(it.eng, int32(k)); err != nil {
			return err
		}
	}
	return nil
}

// indexRecomputes files a plan's recomputes by the op that produces, drops
// and needs each.
func (p *policy) indexRecomputes(rcs []simulate.Recompute) {
	p.recomputes = rcs
	p.rlive = make([]rcLive, len(rcs))
	p.prodAt, p.dropAt, p.recAt = map[int][]int32{}, map[int][]int32{}, map[int][]int32{}
	for k, r := range rcs {
		p.prodAt[r.Op] = append(p.prodAt[r.Op], int32(k))
		p.dropAt[r.Drop] = append(p.dropAt[r.Drop], int32(k))
		p.recAt[r.Before] = append(p.recAt[r.Before], int32(k))
	}
}

// recomputable marks the profiled ops whose host handed the Engine a way to
// run them again and that the planner may recompute (mre.Recomputable: no
// random numbers, no writes into their inputs).
func recomputable(host []bool) func(it *trace.Iteration) []bool {
	return func(it *trace.Iteration) []bool {
		ok := mre.Recomputable(it)
		for i := range ok {
			ok[i] = ok[i] && i < len(host) && host[i]
		}
		return ok
	}
}
