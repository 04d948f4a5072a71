package chameleon

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/trace"
)

// The executor: it moves tensors between device memory and pinned host
// memory without blocking the host. A copy out waits on an event recorded
// on the compute stream; memory freed behind a copy carries the copy's
// event; compute waits for a copy back only at the tensor's next use.

type residency uint8

const (
	resident  residency = iota
	swappedIn           // resident, but the copy back may still be running: compute must wait on ready
	swapped             // bytes only on the host
	dropped             // bytes nowhere: its producer runs again before its next use
)

// allocate gets device memory for stream s, at offset off of the
// allocator's memory where the policy's layout puts it (-1: anywhere free),
// swapping out idle tensors (see victims) while no free block fits.
//
// A victim the pinned pool has no buffer for (a host budget, a pool too
// split for it) stays and the choice is made again without it.
func (e *Engine) allocate(size int64, s device.Stream, off int64) (device.DevPtr, error) {
	var noHost []*Tensor
	for {
		ptr, err := e.alloc.AllocAt(size, s, off)
		if err == nil {
			e.logMiss("alloc", off, ptr, size)
			return ptr, nil
		}
		if !errors.Is(err, device.ErrOutOfMemory) {
			return 0, err
		}
		vs := e.victims(size, noHost)
		if len(vs) == 0 {
			st := e.alloc.Stats()
			var pinned int64
			for _, t := range e.live {
				if t.pin == e.serial && t.state != swapped && t.state != dropped {
					pinned += t.size
				}
			}
			return 0, fmt.Errorf("%w: %d bytes wanted; %d of %d in use by tensors the current op needs or that cannot move (the op's own: %d bytes; largest free block %d; %d tensors with no pinned buffer to go to)",
				ErrOutOfMemory, size, st.Allocated, st.Reserved, pinned, st.LargestFree, len(noHost))
		}
		for _, v := range vs {
			if err := e.swapOutFrom(v, evictedFrom); err != nil {
				if errors.Is(err, errNoPinned) {
					noHost = append(noHost, v) // no copy queued: it stays
					continue
				}
				return 0, err
			}
			e.stats.Evictions++
			e.it.evictions++
			e.it.evictedBytes += v.size
		}
		if l := e.cfg.evictLog; l != nil {
			st := e.alloc.Stats()
			l.Debug("evict", "op", e.it.op, "want", size, "victims", len(vs), "allocated", st.Allocated,
				"reserved", st.Reserved, "in_pages", st.InPages, "largest_free", st.LargestFree, "live_bytes", e.liveB)
		}
	}
}

// evictedFrom is the step a forced eviction tells the allocator its
// memory is done with (Allocator.FreeAfterFrom): past the repetition's
// last. The schedule meant the tensor to stay, so a placement plan made
// from this repetition keeps its memory taken to the end rather than
// handing it to blocks that, in a repetition with no eviction, would find
// the tensor still there.
const evictedFrom = math.MaxInt32

// evictCost is what evicting t costs, in bytes: its bytes, and for the
// copy itself what the H200's link moves in the ~10 µs of a copy's launch
// and events (evictCopy), or a page of the mapped allocator (page; 0 for
// segments) if more: a tensor costs a copy out and, when it is needed, a
// copy back whatever its size. So the window that frees a page with one
// tensor wins over one with fifty tiny ones (scalars, router weights),
// each of which would come back on demand. Under a host budget pinned
// bytes are what runs out, and a copy costs only its page.
func evictCost(t *Tensor, page int64, budgeted bool) int64 {
	if budgeted {
		return max(t.size, page)
	}
	return t.size + max(evictCopy, page)
}

// evictCopy is the bytes the link moves in a copy's fixed cost.
const evictCopy = 512 << 10

// victims picks the tensors to swap out when an allocation of want bytes
// fails. Enough free bytes are not enough: the request needs one free run
// of addresses, which only the allocator can see (its segments, free blocks
// and rounding), so it chooses the window: the run of resident tensors,
// none pinned by the current op, whose removal joins the free gaps around
// them into a block of at least want bytes, with the fewest bytes to move
// (each tensor counting a copy's fixed cost, evictCost); among equal windows the least
// recently used. Persistent tensors qualify
// too: optimizer state sits idle through forward and backward, and moving
// it is what lets a tight limit hold an op's working set. No window means
// no eviction can make the request fit.
func (e *Engine) victims(want int64, noHost []*Tensor) []*Tensor {
	res := e.scratch[:0]
	blocks := e.blocks[:0]
	page, budgeted := e.alloc.Stats().PageSize, e.cfg.ranks.hostShare() > 0
	// The tensors that may hold device memory (onDevice), not every live
	// one: under a small limit most are off the device, and an eviction
	// scans what is on it. Those that left are dropped from the list here.
	kept := e.onDevice[:0]
	for _, t := range e.onDevice {
		if t.state == swapped || t.state == dropped {
			t.onDev = false
			continue
		}
		t.dslot = len(kept)
		kept = append(kept, t)
	}
	clear(e.onDevice[len(kept):])
	e.onDevice = kept
	for _, t := range e.onDevice {
		if t.state != swapped && t.state != dropped {
			res = append(res, t)
			movable := t.pin != e.serial && !slices.Contains(noHost, t)
			blocks = append(blocks, device.Resident{Ptr: t.ptr, Movable: movable, Cost: evictCost(t, page, budgeted), Age: t.lastUse})
		}
	}
	e.scratch, e.blocks = res, blocks
	window := func() []int {
		idx, ok, err := e.alloc.EvictionWindow(want, blocks, e.window[:0])
		e.window = idx
		if err != nil || !ok {
			return nil
		}
		return idx
	}
	var idx []int
	if ev := e.cfg.evictor; ev != nil {
		idx = ev.Victims(want, slices.Clone(blocks), window)
	} else {
		idx = window()
	}
	vs := make([]*Tensor, 0, len(idx))
	for _, k := range idx {
		// What an Evictor returns is checked: a tensor in range, movable,
		// once.
		if k >= 0 && k < len(res) && blocks[k].Movable && !slices.Contains(vs, res[k]) {
			vs = append(vs, res[k])
		}
	}
	return vs
}

// Evictor chooses what an allocation that does not fit swaps out
// (WithEvictor): given the bytes wanted and the resident tensors as the
// allocator sees them (address, whether they may move now, the cost of
// moving them, when they were last used), it returns the indices of those
// to evict; none when no eviction can make the request fit. window is the
// default choice, the allocator's: the cheapest run of adjacent movable
// blocks whose eviction frees one range (or, on mapped pages, the pages)
// the request needs. Only the allocator sees its segments, free blocks and
// rounding, so tensors chosen elsewhere may free bytes the request still
// cannot use: the allocation is tried again after each round of
// evictions, and the Evictor asked again. Indices out of range, of a
// tensor that may not move, or repeated are ignored.
type Evictor interface {
	Victims(want int64, resident []device.Resident, window func() []int) []int
}

// EvictorFunc adapts a function to Evictor.
type EvictorFunc func(want int64, resident []device.Resident, window func() []int) []int

// Victims calls f.
func (f EvictorFunc) Victims(want int64, resident []device.Resident, window func() []int) []int {
	return f(want, resident, window)
}

// errNoPinned is a swap-out's failure to get a pinned buffer: nothing was
// copied, and the tensor stays where it was.
var errNoPinned = errors.New("no pinned buffer")

// swapOut copies t to pinned host memory on the d2h stream after the
// compute stream's work so far, and frees its device memory behind the copy.
func (e *Engine) swapOut(t *Tensor) error { return e.swapOutFrom(t, -1) }

// swapOutFrom is swapOut for a planned swap whose memory the plan frees
// from op from (simulate.Swap.Free; negative: when the copy is done): the
// allocator's placement reuses it from then.
func (e *Engine) swapOutFrom(t *Tensor, from int) error {
	if t.state == swapped || t.state == dropped {
		return nil
	}
	if t.kept {
		return e.evictKept(t)
	}
	after := e.ring[e.compute].next()
	if t.state == swappedIn {
		// Still arriving: the copy out must follow the copy back.
		if err := e.dev.StreamWait(e.d2h, t.ready); err != nil {
			return faulted("copy out", t, err)
		}
	}
	if err := e.dev.Record(after, e.compute); err != nil {
		return faulted("copy out", t, err)
	}
	if err := e.dev.StreamWait(e.d2h, after); err != nil {
		return faulted("copy out", t, err)
	}
	buf, err := e.hostBuf(t)
	if err != nil {
		return fmt.Errorf("chameleon: %w for tensor %d (%d bytes): %w", errNoPinned, t.id, t.size, err)
	}
	// On a fault the tensor stays on the device and the buffer goes back:
	// at once when nothing was queued, behind the copy when it was.
	k := e.tm.copyBegin(e.d2h)
	if err := e.dev.CopyD2H(buf, t.ptr, e.d2h); err != nil {
		return faulted("copy out", t, err, func() error { return e.pool.Put(buf) })
	}
	e.tm.copyEnd(k, e.d2h, t.size)
	done := e.ring[e.d2h].next()
	if err := e.dev.Record(done, e.d2h); err != nil {
		return faulted("copy out", t, err, func() error { return e.dev.SyncStream(e.d2h) }, func() error { return e.pool.Put(buf) })
	}
	if err := e.alloc.FreeAfterFrom(t.ptr, done, e.d2h, from); err != nil {
		return faulted("copy out", t, err, func() error { return e.pool.PutAfter(buf, done, e.d2h) })
	}
	t.host, t.outDone, t.state, t.ptr = buf, done, swapped, 0
	e.stats.SwapsOut++
	e.stats.SwappedOutBytes += t.size
	return nil
}

// writeBack copies t to pinned host memory on the d2h stream after the
// compute stream's work so far, and keeps it on the device: its host copy
// is then current (kept), until an op writes t, and the swap-out planned
// for later only releases the device memory, once the copy is done (the
// copy's event is t's ready event, which evictKept waits for). It does
// nothing (false) for a tensor that is not resident or whose host copy is
// current already, and where no pinned buffer is free: the swap-out then
// copies as usual.
func (e *Engine) writeBack(t *Tensor) (bool, error) {
	if t.state != resident || t.kept {
		return false, nil
	}
	buf, err := e.hostBuf(t)
	if errors.Is(err, device.ErrOutOfMemory) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("chameleon: write-back of tensor %d (%d bytes): %w", t.id, t.size, err)
	}
	after := e.ring[e.compute].next()
	if err := e.dev.Record(after, e.compute); err != nil {
		return false, faulted("write-back", t, err, func() error { return e.pool.Put(buf) })
	}
	if err := e.dev.StreamWait(e.d2h, after); err != nil {
		return false, faulted("write-back", t, err, func() error { return e.pool.Put(buf) })
	}
	k := e.tm.copyBegin(e.d2h)
	if err := e.dev.CopyD2H(buf, t.ptr, e.d2h); err != nil {
		return false, faulted("write-back", t, err, func() error { return e.pool.Put(buf) })
	}
	e.tm.copyEnd(k, e.d2h, t.size)
	done := e.ring[e.d2h].next()
	if err := e.dev.Record(done, e.d2h); err != nil {
		return false, faulted("write-back", t, err, func() error { return e.dev.SyncStream(e.d2h) }, func() error { return e.pool.Put(buf) })
	}
	t.host, t.kept, t.wb, t.ready = buf, true, true, done
	e.stats.WriteBacks++
	e.stats.SwappedOutBytes += t.size
	return true, nil
}

// settleWriteBack makes the compute stream wait for t's write-back, if it
// has one whose copy may still read t's device memory, so that memory
// freed behind the compute stream is not overwritten under the copy.
func (e *Engine) settleWriteBack(t *Tensor) error {
	if !t.wb {
		return nil
	}
	t.wb = false
	return e.dev.StreamWait(e.compute, t.ready)
}

// evictKept swaps out a tensor whose host copy is current (kept): its
// device memory goes (after the compute stream's work so far, or after its
// copy back if that is still running) and nothing is copied. The copy out's
// event is one the d2h stream records behind the copy back, so that the
// buffer's later users wait as for a copied tensor.
func (e *Engine) evictKept(t *Tensor) error {
	if err := e.dev.StreamWait(e.d2h, t.ready); err != nil {
		return faulted("release of the kept copy", t, err)
	}
	done := e.ring[e.d2h].next()
	if err := e.dev.Record(done, e.d2h); err != nil {
		return faulted("release of the kept copy", t, err)
	}
	if err := e.settleWriteBack(t); err != nil {
		return faulted("release of the kept copy", t, err)
	}
	if err := e.freeDevice(t); err != nil {
		return faulted("release of the kept copy", t, err)
	}
	t.kept, t.outDone, t.state, t.ptr = false, done, swapped, 0
	e.stats.SwapsOut++
	e.stats.KeptEvictions++
	e.stats.KeptBytes += t.size
	return nil
}

// swapIn allocates device memory for t and queues the copy back on the h2d
// stream; compute waits for it only at t's next use. A prefetch (evict
// false) does not push other tensors out to make room: it reports false and
// is tried again at the next op, or at the use.
func (e *Engine) swapIn(t *Tensor, evict bool, off int64) (bool, error) {
	if t.state != swapped {
		return true, nil
	}
	var ptr device.DevPtr
	var err error
	if evict {
		ptr, err = e.allocate(t.size, e.h2d, off)
	} else {
		ptr, err = e.alloc.AllocAt(t.size, e.h2d, off)
		if err == nil {
			e.logMiss("swap in", off, ptr, t.size)
		}
		if errors.Is(err, device.ErrOutOfMemory) {
			return false, nil
		}
	}
	if err != nil {
		return false, fmt.Errorf("chameleon: swap in tensor %d: %w", t.id, err)
	}
	// On a fault the tensor stays on the host and the device block goes
	// back: at once when nothing was queued on it, after the copy when it was.
	free := func() error { return e.alloc.Free(ptr) }
	if err := e.dev.StreamWait(e.h2d, t.outDone); err != nil {
		return false, faulted("copy in", t, err, free)
	}
	k := e.tm.copyBegin(e.h2d)
	if err := e.dev.CopyH2D(ptr, t.host, e.h2d); err != nil {
		return false, faulted("copy in", t, err, free)
	}
	e.tm.copyEnd(k, e.h2d, t.size)
	ready := e.ring[e.h2d].next()
	if err := e.dev.Record(ready, e.h2d); err != nil {
		return false, faulted("copy in", t, err, func() error { return e.dev.SyncStream(e.h2d) }, free)
	}
	if t.keepHost || t.kind.persistent() {
		// Parameters and optimizer state often come back only to be read
		// (frozen weights, every weight at inference), and so does an
		// activation the plan swaps out again unwritten (keepHost): the
		// host copy is kept, current until an op writes the tensor.
		t.keepHost = false
		t.ptr, t.ready, t.state, t.kept = ptr, ready, swappedIn, true
		e.gotDevice(t)
		e.stats.SwapsIn++
		e.stats.SwappedInBytes += t.size
		return true, nil
	}
	if err := e.pool.PutAfter(t.host, ready, e.h2d); err != nil {
		// The copy is queued and tracked: the tensor arrives; its host
		// buffer goes back once the copy is done.
		host := t.host
		t.ptr, t.ready, t.state, t.host = ptr, ready, swappedIn, device.HostBuf{}
		e.gotDevice(t)
		return true, faulted("copy in", t, err, func() error { return e.dev.SyncEvent(ready) }, func() error { return e.pool.Put(host) })
	}
	t.ptr, t.ready, t.state, t.host = ptr, ready, swappedIn, device.HostBuf{}
	e.gotDevice(t)
	e.stats.SwapsIn++
	e.stats.SwappedInBytes += t.size
	return true, nil
}

// faulted is the error of a failed swap step, after undoing what the step
// took: the undo steps run in order and stop at the first that fails, since
// a later one may be unsafe without it (a buffer given back while a copy
// may still use it). Their errors join the step's.
func faulted(what string, t *Tensor, err error, undo ...func() error) error {
	errs := []error{fmt.Errorf("chameleon: %s of tensor %d (%d bytes): %w", what, t.id, t.size, err)}
	for _, u := range undo {
		if uerr := u(); uerr != nil {
			errs = append(errs, fmt.Errorf("chameleon: undoing the failed %s: %w", what, uerr))
			break
		}
	}
	return errors.Join(errs...)
}

// eventRing hands out events recorded on one stream in turn. Reusing an
// event of the same stream is safe: a later record on a FIFO stream covers
// all the work an earlier one did, so a late waiter only waits longer.
type eventRing struct {
	dev device.Device
	evs []device.Event
	i   int
}

func newEventRing(dev device.Device, s device.Stream, n int) (*eventRing, error) {
	r := &eventRing{dev: dev}
	for range n {
		ev, err := dev.NewEvent()
		if err != nil {
			r.close()
			return nil, fmt.Errorf("chameleon: event: %w", err)
		}
		r.evs = append(r.evs, ev)
	}
	return r, nil
}

func (r *eventRing) next() device.Event {
	ev := r.evs[r.i]
	r.i = (r.i + 1) % len(r.evs)
	return ev
}

func (r *eventRing) close() error {
	var errs []error
	for _, ev := range r.evs {
		errs = append(errs, r.dev.DestroyEvent(ev))
	}
	r.evs = nil
	return errors.Join(errs...)
}

// executor is what the Engine's executor owns: the device allocator and
// pinned host pool, the streams and their events, the tensors and their
// handles, the one prefetch queue, and the layout the allocator follows.
type executor struct {
	alloc             *device.Allocator
	pool              *device.HostPool
	compute, d2h, h2d device.Stream
	ring              map[device.Stream]*eventRing
	// inOp is set between an op's Before and After: a tensor allocated
	// meanwhile must not unpin that op's tensors.
	inOp    bool
	live    []*Tensor
	slab    []Tensor // handles not yet handed out; a released one is never handed out again
	scratch []*Tensor
	blocks  []device.Resident // the allocator's view of scratch, for victims
	window  []int             // victims' indices into scratch
	nextID  trace.TensorID
	serial  uint64
	// liveB is the bytes of unreleased tensors, resident or not: a
	// released one a recompute still holds, or makes again, counts gone,
	// as a run without the policy would have it (the profile's Mem).
	liveB int64
	// onDevice lists the tensors that may hold device memory (gotDevice),
	// pruned by victims of those that no longer do.
	onDevice []*Tensor
	// ran is the policy in force at the last Begin (nil: none): the copies
	// back it left due are carried into the next iteration (carriedIn).
	ran *policy
	// placedFor is the policy the allocator's placement follows (nil:
	// none), so that a new policy starts a new recording.
	placedFor *policy
	// placedBefore is placedFor at the Begin before: the allocator plans
	// placement from a repetition that ran the policy whole, not from the
	// first one after a change of policy, which still moves the last
	// one's tensors.
	placedBefore *policy
	// following is the layout the allocator follows (nil: none);
	// placedAt and missedAt the allocator's counts when it began the last
	// iteration, offLayout the iterations in a row that missed too many.
	following          *policyLayout
	placedAt, missedAt int64
	offLayout          int
	// unplaced are the op sequences (policyKey.Hash) whose placement was
	// given up, a layout's (layoutGiveUp) or the allocator's own
	// (Stats.GaveUp): their steps do not recur closely enough, and their
	// policies, planned again or not, run on best fit from then on.
	unplaced map[uint64]bool
	// prefetches are the tensors Prefetch was asked for that found no
	// free device memory yet: tried again at each op and after each Evict.
	prefetches prefetchQueue
}

// gotDevice notes that t holds device memory now (NewTensor, a copy back,
// a recompute): victims looks among those.
func (e *Engine) gotDevice(t *Tensor) {
	if !t.onDev {
		t.onDev, t.dslot = true, len(e.onDevice)
		e.onDevice = append(e.onDevice, t)
	}
}

// leftDevice takes a freed tensor off the list of those that may hold
// device memory (the others leave it lazily, in victims).
func (e *Engine) leftDevice(t *Tensor) {
	if !t.onDev {
		return
	}
	last := e.onDevice[len(e.onDevice)-1]
	e.onDevice[t.dslot], last.dslot = last, t.dslot
	e.onDevice[len(e.onDevice)-1] = nil
	e.onDevice = e.onDevice[:len(e.onDevice)-1]
	t.onDev = false
}
