package chameleon

import (
	"errors"
	"fmt"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/match"
	"github.com/chameleon-go/chameleon/trace"
)

// Kind says what a tensor is, and so how the Engine may move it.
type Kind uint8

const (
	// Activation tensors are produced by ops and may be swapped.
	Activation Kind = iota
	// Persistent tensors (parameters; optimizer state may be declared so
	// too) live across iterations. The planner moves them over their idle
	// gaps inside an iteration (a weight from its layer's forward to its
	// backward), by handle rather than by matching.
	Persistent
	// OptimizerState is persistent like a parameter, and recorded as
	// optimizer state in the Engine's profiles.
	OptimizerState
	// Frozen tensors are parameters the host never writes during the run:
	// every weight at inference, the base weights of an adapter fine-tune.
	// Their bytes are set once, by Engine.Fill or by the first op that
	// lists the tensor in Out; an op that lists it in Out after that is
	// refused. Their host copy then stays current for the whole run: only
	// the first swap-out copies (and none when Fill set them), every later
	// one releases the device memory and copies nothing, and each comes
	// back with one copy in. Profiles record them as parameters with
	// Frozen set (trace.Tensor.Frozen), so plans count no copy out.
	Frozen
)

// persistent reports whether tensors of kind k live across iterations.
func (k Kind) persistent() bool { return k != Activation }

// traceKind is k in a profile.
func (k Kind) traceKind() trace.Kind {
	switch k {
	case Persistent, Frozen:
		return trace.KindParam
	case OptimizerState:
		return trace.KindOptState
	}
	return trace.KindActivation
}

// KindOf is the Engine's kind for a traced tensor's: parameters and
// optimizer state are persistent, the rest (inputs, activations) are
// activations. traceKind maps it back.
func KindOf(k trace.Kind) Kind {
	switch k {
	case trace.KindParam:
		return Persistent
	case trace.KindOptState:
		return OptimizerState
	}
	return Activation
}

// KindOfTensor is the Engine's kind for a traced tensor: KindOf of its
// kind, and Frozen for a parameter marked frozen.
func KindOfTensor(t *trace.Tensor) Kind {
	if t.Kind == trace.KindParam && t.Frozen {
		return Frozen
	}
	return KindOf(t.Kind)
}

// Op describes one operator call to the Engine. The host reuses Op values
// and their slices between calls; the Engine does not keep them.
type Op struct {
	Name, Overload string
	// Module is the call-site identity (module path or call stack).
	Module string
	Phase  trace.Phase
	In     []*Tensor
	// Out lists the tensors the op writes: fresh ones from NewTensor, and
	// existing ones written in place.
	Out []*Tensor
	// FLOPs and Bytes are optional costs the time estimator uses for op
	// names it has no model of.
	FLOPs, Bytes float64
	// Recompute, when set, runs the op again: it launches the same kernels
	// on the compute stream, reading In and writing Out through their
	// handles (Ptr inside the call). It lets the planner drop the op's
	// output after a use and make it again before its next one, instead of
	// keeping or swapping it. The host promises that the kernels give the
	// same bytes for the same inputs: no random numbers (dropout draws from
	// the RNG state of the moment, which a recompute cannot replay), no
	// atomics that reorder a reduction, no writes into the inputs. The
	// Engine keeps the inputs on the device until the recompute has run,
	// even those the host releases before it. It runs inside an op's
	// Before, the Engine locked: it may read the Engine (Stats, Stage,
	// Link, GroupTimes, Simulation) and the tensors' Ptr, and a call that
	// would change the Engine (NewTensor, Release, an iteration's calls,
	// Evict, Prefetch, Fill, Close) returns ErrInCallback. A panic in it
	// leaves the iteration under way: End it before the next Begin.
	Recompute func() error
}

// Tensor is a handle on device memory the Engine manages. The host reads the
// current device address with Ptr inside the op (between Before and After)
// that lists the tensor; the address may change between ops.
type Tensor struct {
	id      trace.TensorID
	size    int64
	kind    Kind
	dtype   string
	shape   []int64
	ptr     device.DevPtr
	host    device.HostBuf
	state   residency
	ready   device.Event // copy back done (state swappedIn); a kept write-back's copy done (wb)
	outDone device.Event // copy out done (state swapped)
	// kept: resident again, t still holds the host copy it came back from
	// (or a write-back made), which stays current until an op writes t
	// (lists it in Out): a swap out until then releases the device memory
	// and copies nothing.
	kept bool
	// wb: the kept copy is a write-back's, which may still be reading the
	// device memory until ready: whatever frees that memory first makes
	// the compute stream wait for it (settleWriteBack).
	wb bool
	// keepHost: keep the host copy at the coming swap-in (policy.keepIn).
	keepHost bool
	produced bool
	// written: a Frozen tensor's bytes were set (Fill, or its first op).
	written  bool
	released bool
	pin      uint64 // op serial during which it must stay resident
	// listed is the op serial of the op that lists it (Before): a hint
	// waits for that op's After. A tensor made while an op runs, by any
	// goroutine, is pinned by that op but not listed.
	listed  uint64
	lastUse uint64 // op serial of its last use: the eviction order
	plan    int32  // index of the planned swap it was matched to, -1
	rc      int32  // index of the planned recompute it was matched to, -1
	holds   int32  // recomputes still to run that read it: its memory stays
	remake  int32  // recomputes still to run that make it again: its handle stays
	// onDev: it is in Engine.onDevice, at dslot.
	onDev bool
	dslot int
	rm    int32   // index of the planned remade input it was matched to, -1
	eng   *Engine // the Engine that made it
	feat  match.Features
	slot  int // index in Engine.live
}

// Ptr is the tensor's device address. Valid inside an op that lists the
// tensor; it panics on a released tensor, the host's use-after-free.
func (t *Tensor) Ptr() device.DevPtr {
	if t.released && t.holds == 0 && t.remake == 0 {
		panic("chameleon: Ptr of a released tensor")
	}
	if t.state == dropped {
		panic("chameleon: Ptr of a dropped tensor outside an op that lists it")
	}
	if t.state == swapped {
		panic("chameleon: Ptr of a swapped-out tensor outside an op that lists it")
	}
	return t.ptr
}

// Size is the tensor's size in bytes.
func (t *Tensor) Size() int64 { return t.size }

// ID is the tensor's id in the Engine's profiles.
func (t *Tensor) ID() trace.TensorID { return t.id }

// NewTensor allocates an Engine-managed tensor of size bytes. Activations
// are allocated by the host right before the op that produces them (listed
// in its Out); persistent tensors at any time.
func (e *Engine) NewTensor(size int64, kind Kind, dtype string, shape []int64) (*Tensor, error) {
	if err := e.lock(); err != nil {
		return nil, err
	}
	defer e.mu.Unlock()
	if e.closed {
		return nil, ErrClosed
	}
	if kind > Frozen {
		return nil, fmt.Errorf("chameleon: new tensor of %d bytes: kind %d is none of Activation, Persistent, OptimizerState, Frozen", size, kind)
	}
	for i, d := range shape {
		if d < 0 {
			return nil, fmt.Errorf("chameleon: new tensor of %d bytes: shape %v: dimension %d is negative", size, shape, i)
		}
	}
	if size <= 0 || size > e.cfg.limit {
		// Larger than the limit can never be resident; refusing it here
		// also keeps the allocator's block rounding from overflowing.
		return nil, fmt.Errorf("chameleon: tensor of %d bytes (%s %v): want 1 to %d bytes, the memory limit", size, dtype, shape, e.cfg.limit)
	}
	if !e.inOp {
		e.serial++
	}
	pin := e.serial // not evictable while the op it is made for runs
	id := e.nextID
	e.nextID++
	var off int64 = -1
	if e.it.active {
		off = e.it.madeAt(e.policy, size)
	}
	ptr, err := e.allocate(size, e.compute, off)
	if err != nil {
		return nil, fmt.Errorf("chameleon: new tensor of %d bytes: %w", size, err)
	}
	t := e.handle()
	t.id, t.size, t.kind, t.dtype, t.shape, t.plan, t.rc, t.rm, t.eng = id, size, kind, dtype, shape, -1, -1, -1, e
	t.pin = pin
	t.ptr = ptr
	t.lastUse = e.serial
	t.slot = len(e.live)
	e.live = append(e.live, t)
	e.gotDevice(t)
	e.liveB += size
	if kind.persistent() {
		t.produced = true
	}
	return t, nil
}

// handle is a fresh handle. Handles are never reused: a released handle
// stays released, so a stale copy of it can neither free nor reach a later
// tensor. They come out of slabs, one heap allocation per slabHandles
// tensors; a slab is collected once the host and the Engine hold none of
// its handles.
func (e *Engine) handle() *Tensor {
	if len(e.slab) == 0 {
		e.slab = make([]Tensor, slabHandles)
	}
	t := &e.slab[0]
	e.slab = e.slab[1:]
	return t
}

// Release returns a tensor's memory. The device memory is reused only after
// the work already queued on it completes (an event, not a host wait).
// Releasing a tensor again does nothing; an op that lists a released tensor
// is an error. A handle is never handed out again, so a stale one cannot
// touch a later tensor.
func (e *Engine) Release(t *Tensor) error {
	if t == nil {
		return nil
	}
	if t.eng != e { // set once, before the host has the handle
		return fmt.Errorf("chameleon: release tensor %d: it belongs to another Engine", t.id)
	}
	if err := e.lock(); err != nil {
		return err
	}
	defer e.mu.Unlock()
	if t.released {
		return nil
	}
	if e.closed {
		return ErrClosed
	}
	if e.inOp && t.listed == e.serial {
		return fmt.Errorf("chameleon: release tensor %d: the op under way lists it; release it after that op's After", t.id)
	}
	t.released = true
	e.liveB -= t.size
	if p := e.policy; p != nil && t.state == dropped && t.rc >= 0 {
		p.abandon(e, t.rc) // never made again: its inputs need not wait
	}
	if t.holds > 0 {
		return nil // freed once the recomputes that read it have run
	}
	if t.remake > 0 {
		// A recompute makes it again later: the memory goes now, the
		// handle once that recompute has run.
		return e.drop(t)
	}
	return e.free(t)
}

// drop gives t's memory back but keeps its handle (state dropped).
func (e *Engine) drop(t *Tensor) error {
	err := e.unkeep(t)
	switch t.state {
	case resident, swappedIn:
		err = errors.Join(err, e.freeDevice(t))
	case swapped:
		err = errors.Join(err, e.pool.PutAfter(t.host, t.outDone, e.d2h))
	}
	t.ptr, t.host, t.state = 0, device.HostBuf{}, dropped
	return err
}

// unkeep gives back the host copy a resident tensor kept (see kept): after
// the copy back that read it.
func (e *Engine) unkeep(t *Tensor) error {
	if !t.kept {
		return nil
	}
	t.kept, t.wb = false, false
	buf := t.host
	t.host = device.HostBuf{}
	return e.pool.PutAfter(buf, t.ready, e.h2d)
}

// free gives a released tensor's memory back.
func (e *Engine) free(t *Tensor) error {
	last := e.live[len(e.live)-1]
	e.live[t.slot], last.slot = last, t.slot
	e.live = e.live[:len(e.live)-1]
	e.leftDevice(t)
	if err := e.unkeep(t); err != nil {
		return err
	}
	switch t.state {
	case resident, swappedIn:
		return e.freeDevice(t)
	case dropped:
		return nil
	default:
		if err := e.pool.PutAfter(t.host, t.outDone, e.d2h); err != nil {
			return fmt.Errorf("chameleon: free tensor %d (%d bytes) off the device: %w", t.id, t.size, err)
		}
		return nil
	}
}

// freeDevice gives t's device memory back behind the work that may still
// use it: the compute stream's kernels so far, or, for a tensor still
// arriving (swappedIn: compute never waited on it), its copy back.
func (e *Engine) freeDevice(t *Tensor) error {
	var err error
	if t.state == swappedIn {
		err = e.alloc.FreeAfter(t.ptr, t.ready, e.h2d)
	} else {
		err = e.alloc.FreeOn(t.ptr, e.compute)
	}
	if err != nil {
		return fmt.Errorf("chameleon: free tensor %d (%d bytes): %w", t.id, t.size, err)
	}
	return nil
}
