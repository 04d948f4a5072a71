package chameleon

import (
	"fmt"
	"slices"

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

// rmLive is one input that recomputes make again (simulate.Remade): freed
// by the host before them, its handle is kept, and its producer runs again
// just before the recompute that reads it.
type rmLive struct {
	x  *Tensor
	in []*Tensor
	// held are the inputs of in it holds until its users have run: not
	// those made again themselves (a chain), which the plan frees when the
	// host releases them and makes again first.
	held  []*Tensor
	fn    func() error
	users int // recomputes of this iteration that still need it
}

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
	for _, m := range p.rmProdAt[i] {
		s := &p.rmlive[m]
		if s.x == nil || op.Recompute == nil || s.fn != nil || !slices.Contains(op.Out, s.x) {
			continue // matched elsewhere, or no way to run again
		}
		s.fn, s.users = op.Recompute, p.rmUsers[m]
		s.in = append(s.in[:0], op.In...)
		s.held = s.held[:0]
		for _, t := range s.in {
			if t.remake > 0 {
				continue // made again too, before this one
			}
			t.holds++
			s.held = append(s.held, t)
		}
		s.x.remake += int32(s.users)
	}
	for _, k := range p.prodAt[i] {
		r := &p.rlive[k]
		if r.x == nil || op.Recompute == nil || r.fn != nil || !slices.Contains(op.Out, r.x) {
			continue // matched elsewhere, or no way to run again
		}
		r.fn = op.Recompute
		r.in = append(r.in[:0], op.In...)
		for _, t := range r.in {
			if !p.remadeFor(int32(k), t) {
				t.holds++
			}
		}
	}
}

// remadeFor reports whether recompute k makes its input t again rather than
// holding it: the plan frees such an input when the host releases it (its
// memory is not counted until it is made again, just before k), so it must
// not be held, or the device keeps bytes the plan gave to others.
func (p *policy) remadeFor(k int32, t *Tensor) bool {
	for _, m := range p.rcRemade[k] {
		if p.rmlive[m].x == t {
			return true
		}
	}
	return false
}

// drop releases, after op i, the device memory of the tensors the policy
// drops there.
func (it *Iteration) drop(p *policy, i int) error {
	e := it.eng
	for _, k := range p.dropAt[i] {
		r := &p.rlive[k]
		x := r.x
		if !r.captured() || r.ran || x.released || x.state == dropped {
			continue
		}
		// Resident, arriving or swapped out (forced), its bytes go.
		if err := e.drop(x); err != nil {
			return fmt.Errorf("chameleon: drop tensor %d: %w", x.id, err)
		}
		x.rc = k // the recompute for this gap
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
	var off int64 = -1
	if p.layout != nil {
		off = at(p.layout.rc, int(k))
	}
	if err := it.rerun(p, "recompute", x, r.in, r.fn, off); err != nil {
		return err
	}
	// Inputs made again only for this go again (the host released them).
	for _, m := range p.rcRemade[k] {
		if y := p.rmlive[m].x; y != nil && y.released && y.state == resident {
			// The block is the allocator's once FreeOn returns, error or not.
			ptr := y.ptr
			y.ptr, y.state = 0, dropped
			if err := e.alloc.FreeOn(ptr, e.compute); err != nil {
				return err
			}
		}
	}
	return p.finish(e, k)
}

// remake makes input slot m again by running its producer.
func (it *Iteration) remake(p *policy, m int32) error {
	s := &p.rmlive[m]
	x := s.x
	if x.state != dropped {
		return nil
	}
	if s.fn == nil {
		return fmt.Errorf("chameleon: tensor %d was freed and cannot be made again", x.id)
	}
	var off int64 = -1
	if p.layout != nil && int(m) < len(p.remade) {
		if o, ok := p.layout.remade[remadeKey{p.remade[m].Tensor, it.op}]; ok {
			off = o
		}
	}
	return it.rerun(p, "remake", x, s.in, s.fn, off)
}

// rerun makes x again: its inputs on the device (pinned there), x
// allocated under its handle, the producer's kernels run.
func (it *Iteration) rerun(p *policy, what string, x *Tensor, in []*Tensor, fn func() error, off int64) error {
	e := it.eng
	x.pin = e.serial
	for _, t := range in {
		t.pin = e.serial
	}
	for _, t := range in {
		if err := it.resident1(p, t); err != nil {
			return err
		}
	}
	ptr, err := e.allocate(x.size, e.compute, off)
	if err != nil {
		return fmt.Errorf("chameleon: %s tensor %d: %w", what, x.id, err)
	}
	x.ptr, x.state = ptr, resident
	e.gotDevice(x)
	e.tm.waitBegin() // a recompute is the policy's time, not the op's
	err = e.callback(fn)
	e.tm.waitEnd()
	if err != nil {
		return fmt.Errorf("chameleon: %s tensor %d: %w", what, x.id, err)
	}
	it.recomputes++
	e.stats.Recomputes++
	return nil
}

// resident1 brings a tensor an op or a recompute needs onto the device:
// made again if it is dropped (a recompute, or a chain) or freed (remade),
// brought back if swapped, waited for (on the compute stream) if arriving.
// p is the policy in force, or nil.
func (it *Iteration) resident1(p *policy, t *Tensor) error {
	e := it.eng
	switch {
	case p == nil && t.state == dropped:
		// no policy: nothing can make it again
	case t.state == dropped && t.rc >= 0 && p.rlive[t.rc].x == t && !p.rlive[t.rc].ran:
		if err := it.recompute(p, t.rc); err != nil {
			return err
		}
	case t.state == dropped && t.rm >= 0:
		if err := it.remake(p, t.rm); err != nil {
			return err
		}
	case t.state == swapped:
		// A planned copy back that found no room ahead of its use still
		// has its place in the layout.
		var off int64 = -1
		if p != nil && p.layout != nil && t.plan >= 0 && int(t.plan) < len(p.live) && p.live[t.plan] == t {
			off = at(p.layout.in, int(t.plan))
		}
		if _, err := e.swapIn(t, true, off); err != nil {
			return err
		}
		it.onDemand++
		e.stats.OnDemandIn++
	}
	if t.state == swappedIn {
		e.tm.waitBegin()
		err := e.dev.StreamWait(e.compute, t.ready)
		e.tm.waitEnd()
		if err != nil {
			return err
		}
		t.state = resident
	}
	if t.state != resident {
		return fmt.Errorf("chameleon: tensor %d was dropped and cannot be made again", t.id)
	}
	return nil
}

// finish ends recompute k: its inputs are held no longer.
func (p *policy) finish(e *Engine, k int32) error {
	r := &p.rlive[k]
	if r.ran {
		return nil
	}
	r.ran = true
	var err error
	keep := func(ferr error) {
		if err == nil {
			err = ferr
		}
	}
	for _, t := range r.in {
		if p.remadeFor(k, t) {
			continue // not held: see capture
		}
		keep(e.unhold(t))
	}
	r.in = r.in[:0]
	for _, m := range p.rcRemade[k] {
		s := &p.rmlive[m]
		if s.fn == nil || s.users == 0 {
			continue
		}
		s.users--
		if y := s.x; y != nil {
			if y.remake--; y.remake == 0 && y.released && y.holds == 0 {
				keep(e.free(y))
			}
		}
		if s.users == 0 {
			for _, t := range s.held {
				keep(e.unhold(t))
			}
			s.in, s.held = s.in[:0], s.held[:0]
		}
	}
	return err
}

// unhold ends one hold on t. A released tensor held by nothing more goes:
// freed, or, when a recompute still makes it again, dropped (its memory
// now, its handle once that recompute has run), as Release would have.
func (e *Engine) unhold(t *Tensor) error {
	if t.holds--; t.holds > 0 || !t.released {
		return nil
	}
	if t.remake > 0 {
		return e.drop(t)
	}
	return e.free(t)
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
	for m := range p.rmlive {
		if y := p.rmlive[m].x; y != nil && y.remake > 0 {
			// Its recomputes never captured: nothing will make it again.
			y.remake = 0
			if y.released && y.holds == 0 {
				if err := it.eng.free(y); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// indexRecomputes files a plan's recomputes by the op that produces, drops
// and needs each.
func (p *policy) indexRecomputes(rcs []simulate.Recompute) {
	p.recomputes = rcs
	p.rlive = make([]rcLive, len(rcs))
	p.prodAt, p.dropAt, p.recAt, p.rmProdAt = map[int][]int32{}, map[int][]int32{}, map[int][]int32{}, map[int][]int32{}
	p.rcRemade = make([][]int32, len(rcs))
	slot := map[trace.TensorID]int32{}
	for k, r := range rcs {
		p.prodAt[r.Op] = append(p.prodAt[r.Op], int32(k))
		p.dropAt[r.Drop] = append(p.dropAt[r.Drop], int32(k))
		p.recAt[r.Before] = append(p.recAt[r.Before], int32(k))
		for _, m := range r.Remade {
			x, ok := slot[m.Tensor]
			if !ok {
				x = int32(len(p.remade))
				slot[m.Tensor] = x
				p.remade = append(p.remade, m)
				p.rmUsers = append(p.rmUsers, 0)
				p.rmProdAt[m.Op] = append(p.rmProdAt[m.Op], x)
			}
			p.rmUsers[x]++
			p.rcRemade[k] = append(p.rcRemade[k], x)
		}
	}
	p.rmlive = make([]rmLive, len(p.remade))
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

// callback runs an Op.Recompute callback, its goroutine's calls back into
// the Engine refused (callbackGuard), panic or not.
func (e *Engine) callback(fn func() error) error {
	e.cb.enter()
	defer e.cb.leave()
	return fn()
}
