package chameleon

import (
	"fmt"
)

// Hints from a host that knows the future: an inference server knows which
// session runs next, so it can send an idle session's cache off the device
// (Evict) and ask for the next one's ahead of its turn (Prefetch). Both are
// asynchronous (they queue copies and return) and both keep every byte: a
// tensor evicted comes back, at its next use if not before; one prefetched
// is the one its next op reads. They compose with the policy in force: a
// planned swap-out of a tensor already evicted, or a planned swap-in of one
// already back, does nothing, so nothing is copied or freed twice.

// Evict marks t idle now: its device memory goes, behind the work already
// queued on it, and its bytes stay on the host, copied there on the d2h
// stream, or, when its host copy is current (a Frozen tensor after its
// first swap-out, a parameter no op wrote since it came back), released
// with no copy. A tensor already off the device is left as it is; a
// pending Prefetch of t is cancelled. The tensor comes back at its next
// use, or ahead of it with Prefetch or the policy's own prefetch.
//
// Evict may be called between ops, inside an iteration or outside one,
// from any goroutine. It refuses a tensor the op under way lists (between
// that op's Before and After: its kernels read it), a released tensor, one
// of another Engine and a closed Engine.
func (e *Engine) Evict(t *Tensor) error {
	if err := e.hintable("evict", t); err != nil {
		return err
	}
	if err := e.lock(); err != nil {
		return err
	}
	defer e.mu.Unlock()
	if err := e.hintState("evict", t); err != nil {
		return err
	}
	if e.inOp && t.listed == e.serial {
		return fmt.Errorf("chameleon: evict tensor %d: the op under way lists it; evict it after that op's After", t.id)
	}
	e.dropPrefetch(t)
	if t.state != swapped && t.state != dropped {
		if err := e.swapOut(t); err != nil {
			return err
		}
		e.stats.HintEvictions++
		e.stats.HintEvictedBytes += t.size
	}
	// The memory it gave back may hold a prefetch that waits.
	return e.retryPrefetches()
}

// Prefetch asks for t ahead of its use: when it is off the device, its
// copy back is queued on the h2d stream now, and the next op that lists it
// waits for that copy on the device, not on the host. Prefetch pushes no
// other tensor out: when no device memory is free it waits, and is tried
// again at each op's Before (after the policy's own prefetches) and after
// each Evict, until it is started, t is used (its op brings it back), t is
// evicted or released. A tensor on the device, arriving or dropped (its
// recompute makes it again) is left as it is.
//
// Prefetch may be called at any time, from any goroutine, the op under way
// included (a tensor it lists is on the device). It refuses a released
// tensor, one of another Engine and a closed Engine.
func (e *Engine) Prefetch(t *Tensor) error {
	if err := e.hintable("prefetch", t); err != nil {
		return err
	}
	if err := e.lock(); err != nil {
		return err
	}
	defer e.mu.Unlock()
	if err := e.hintState("prefetch", t); err != nil {
		return err
	}
	if t.state != swapped || e.prefetches.has(t) {
		return nil
	}
	ok, err := e.swapIn(t, false, -1)
	if err != nil {
		return err
	}
	if ok {
		e.stats.HintPrefetches++
		return nil
	}
	e.stats.HintDeferrals++
	e.prefetches.add(t, -1)
	return nil
}

// hintable checks what a hint can check without the lock.
func (e *Engine) hintable(what string, t *Tensor) error {
	if t == nil {
		return fmt.Errorf("chameleon: %s of a nil tensor", what)
	}
	if t.eng != e { // set once, before the host has the handle
		return fmt.Errorf("chameleon: %s tensor %d: it belongs to another Engine", what, t.id)
	}
	return nil
}

// hintState checks, under the lock, that a hint on t can run.
func (e *Engine) hintState(what string, t *Tensor) error {
	switch {
	case e.closed:
		return ErrClosed
	case t.released:
		return fmt.Errorf("chameleon: %s tensor %d: it was released", what, t.id)
	}
	return nil
}

// retryPrefetches starts the host's waiting prefetches, and the copies
// back carried from the iteration before, that fit now, in the order they
// came due, and forgets those no longer off the device.
func (e *Engine) retryPrefetches() error {
	return e.prefetches.retry(false, func(q prefetch) (bool, error) {
		ok, err := e.swapIn(q.t, false, -1)
		switch {
		case !ok:
		case q.carried:
			e.stats.Carried++
		default:
			e.stats.HintPrefetches++
		}
		return ok, err
	})
}

// dropPrefetch forgets a waiting prefetch of t.
func (e *Engine) dropPrefetch(t *Tensor) { e.prefetches.forget(t) }
