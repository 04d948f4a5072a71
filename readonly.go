package chameleon

import (
	"errors"
	"fmt"
	"slices"

	"github.com/chameleon-go/chameleon/device"
)

// Read-only tensors. A Frozen tensor's bytes are set once: by Fill, from
// the host, or by the first op that lists it in Out (a kernel that
// initializes it on the device). From then on no op may write it, so the
// host copy it has once it went out (Fill makes it, or the first swap-out
// copies it) stays current: every later swap-out only releases the device
// memory, every swap-in is one copy in.

// Fill sets a parameter's bytes from the host: src, exactly the tensor's
// size, is copied into the tensor's pinned host copy and its device memory
// is released, so that a model larger than the limit loads without forcing
// anything out. The tensor comes back with one copy in at its first use,
// or ahead of it (the policy's prefetch, or Prefetch). Fill waits for the
// copies that still use the tensor's host memory, so it is meant for load
// time; it must be called between ops, never inside one that lists the
// tensor.
//
// Fill takes persistent tensors (Persistent, OptimizerState, Frozen): an
// activation is made by the op that lists it in Out. A Frozen tensor is
// filled once, and not after an op wrote it; other kinds any number of
// times.
func (e *Engine) Fill(t *Tensor, src []byte) error {
	if t == nil {
		return errors.New("chameleon: fill of a nil tensor")
	}
	if t.eng != e {
		return fmt.Errorf("chameleon: fill tensor %d: it belongs to another Engine", t.id)
	}
	if err := e.lock(); err != nil {
		return err
	}
	defer e.mu.Unlock()
	switch {
	case e.closed:
		return ErrClosed
	case t.released:
		return fmt.Errorf("chameleon: fill tensor %d: it was released", t.id)
	case !t.kind.persistent():
		return fmt.Errorf("chameleon: fill tensor %d: an activation's bytes come from the op that lists it in Out; Fill sets persistent tensors", t.id)
	case int64(len(src)) != t.size:
		return fmt.Errorf("chameleon: fill tensor %d: %d bytes given for a tensor of %d", t.id, len(src), t.size)
	case t.kind == Frozen && t.written:
		return fmt.Errorf("chameleon: fill tensor %d: it is Frozen and its bytes were set already (by Fill or an op): a Frozen tensor is written once", t.id)
	case e.inOp && t.listed == e.serial:
		return fmt.Errorf("chameleon: fill tensor %d: the op under way lists it; fill between ops", t.id)
	case t.state == dropped:
		return fmt.Errorf("chameleon: fill tensor %d: it is dropped", t.id)
	}
	e.dropPrefetch(t)
	if err := e.fill(t, src); err != nil {
		return err
	}
	if t.kind == Frozen {
		t.written = true
	}
	return nil
}

// fill writes src into t's host copy and leaves t swapped out.
func (e *Engine) fill(t *Tensor, src []byte) error {
	if t.state == swapped {
		// Its host copy exists: overwrite it once the copy out that made
		// it (or the copy back that last read it) is done.
		if err := e.dev.SyncEvent(t.outDone); err != nil {
			return faulted("fill", t, err)
		}
		copy(t.host.Bytes(), src)
		return nil
	}
	buf := t.host
	if t.kept {
		// The kept copy is read by the copy back still maybe running.
		if err := e.dev.SyncEvent(t.ready); err != nil {
			return faulted("fill", t, err)
		}
	} else {
		var err error
		if buf, err = e.pool.Get(t.size, e.d2h); err != nil {
			return fmt.Errorf("chameleon: pinned buffer for tensor %d (%d bytes): %w", t.id, t.size, err)
		}
		// The buffer may still be read by an earlier copy: Get queued the
		// waits on d2h, and the host writes only once they are done.
		if err := e.dev.SyncStream(e.d2h); err != nil {
			return faulted("fill", t, err, func() error { return e.pool.Put(buf) })
		}
	}
	copy(buf.Bytes(), src)
	done := e.ring[e.d2h].next()
	if err := e.dev.Record(done, e.d2h); err != nil {
		return faulted("fill", t, err, e.putUnlessKept(t, buf))
	}
	// The device memory goes behind the compute stream's work so far (the
	// kernels that still read it), or behind its copy back.
	if err := e.freeDevice(t); err != nil {
		return faulted("fill", t, err, e.putUnlessKept(t, buf))
	}
	t.host, t.outDone, t.state, t.ptr, t.kept = buf, done, swapped, 0, false
	return nil
}

// putUnlessKept is the undo of a failed fill: a fresh buffer goes back, a
// kept one stays the tensor's.
func (e *Engine) putUnlessKept(t *Tensor, buf device.HostBuf) func() error {
	return func() error {
		if t.kept {
			return nil
		}
		return e.pool.Put(buf)
	}
}

// checkFrozen refuses an op that writes a Frozen tensor whose bytes were
// set already, or that reads one whose bytes never were.
func (it *Iteration) checkFrozen(op *Op) error {
	for _, t := range op.Out {
		if t.kind == Frozen && t.written {
			return fmt.Errorf("chameleon: op %d (%s) writes tensor %d (lists it in Out), which is Frozen and was written already (by Fill or an earlier op): a Frozen tensor is written once", it.op, op.Name, t.id)
		}
	}
	for _, t := range op.In {
		if t.kind == Frozen && !t.written && !slices.Contains(op.Out, t) {
			return fmt.Errorf("chameleon: op %d (%s) reads tensor %d, which is Frozen and was never written: set it with Fill or an op that lists it in Out first", it.op, op.Name, t.id)
		}
	}
	return nil
}
