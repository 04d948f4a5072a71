package device

import (
	"errors"
	"fmt"
	"sync"
)

// BlockSize is the default granularity of Allocator and HostPool blocks, in
// bytes: every block is rounded up to it. It is what CUDA's caching
// allocators (PyTorch's among them) round to, so the memory model of a
// recorded trace (memory.RoundBytes) and the allocator that replays it agree.
const BlockSize = 512

// MemOption configures an Allocator or a HostPool.
type MemOption interface{ apply(*memConfig) }

type memConfig struct {
	align  int64
	growth int64
}

type memOptionFunc func(*memConfig)

func (f memOptionFunc) apply(c *memConfig) { f(c) }

// WithGrowth lets a request that does not fit reserve a new segment of
// max(request, segment) bytes from the backend. The default is no growth: a
// swap path must not call cudaMalloc (~150 us) or cudaHostAlloc (tens of ms)
// on the hot path, so a miss is an error the caller plans around. Values <= 0
// are ignored.
func WithGrowth(segment int64) MemOption {
	return memOptionFunc(func(c *memConfig) {
		if segment > 0 {
			c.growth = segment
		}
	})
}

// WithAlignment sets the granularity of blocks (default BlockSize). It must
// be a power of two; other values are ignored.
func WithAlignment(n int64) MemOption {
	return memOptionFunc(func(c *memConfig) {
		if n > 0 && n&(n-1) == 0 {
			c.align = n
		}
	})
}

func newMemConfig(opts []MemOption) memConfig {
	c := memConfig{align: BlockSize}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	return c
}

// pool is the stream-aware half shared by Allocator and HostPool: an arena
// plus the event handling on reuse.
type pool struct {
	mu            sync.Mutex
	what          string // "allocator", "host pool": for errors
	dev           Device
	cfg           memConfig
	a             arena
	closed        bool
	backendAllocs int64
	// alloc obtains a segment from the backend, free returns them all.
	alloc func(size int64) (uintptr, error)
	free  func() error

	// A mapped allocator's device, page size and address space reserved
	// at a time (see ReserveMapped), with its counts of device calls.
	mapper              Mapper
	page, space         int64
	maps, unmaps, syncs int64
	// copyWaits counts the requests served behind a caller's event of
	// another stream (memory freed behind a copy), a stream wait each.
	copyWaits         int64
	pagesIn, pagesOut int64
	fails             int64    // requests refused (nothing fits)
	srcs              []DevPtr // remap's scratch

	// Events recorded by FreeOn/PutOn, reference-counted by the free blocks
	// that wait on them; free holds the indices no block refers to.
	events []ownedEvent
	idle   []int32
	seq    uint64
	// pl plans the placement of recurring requests (Allocator.Repeat).
	pl placer
	// onWait, when set, is told before and after the waits one allocation
	// queues on its stream (OnStreamWait).
	onWait func(s Stream, after bool)
	// held lists the used blocks freed behind a stream (FreeOn, PutOn)
	// whose guard event could not be recorded nor the stream waited for:
	// the pool's own, still in use, until a wait for their stream succeeds
	// (retryHeld) or they are freed again.
	held []heldBlock
}

// heldBlock is a block freed behind the work queued on s that no event
// guards: it is free once the host has waited for s.
type heldBlock struct {
	addr uintptr
	s    Stream
}

type ownedEvent struct {
	ev   Event
	refs int
}

func (p *pool) init(what string, dev Device, opts []MemOption) {
	p.what, p.dev = what, dev
	p.cfg = newMemConfig(opts)
	p.a = newArena(p.cfg.align)
	p.a.onRef = func(idx int32, delta int) {
		e := &p.events[idx]
		e.refs += delta
		if e.refs == 0 {
			p.idle = append(p.idle, idx)
		}
	}
}

// reserve obtains one segment of size bytes (rounded up) from the backend.
func (p *pool) reserve(size int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("%s: reserve %d bytes: %w", p.what, size, ErrClosed)
	}
	if p.mapper != nil {
		return fmt.Errorf("%s: reserve %d bytes: the allocator maps pages (ReserveMapped): %w", p.what, size, ErrInvalidValue)
	}
	return p.grow(p.a.roundUp(size))
}

// grow adds a segment of size bytes. Called with p.mu held.
func (p *pool) grow(size int64) error {
	if size <= 0 {
		return fmt.Errorf("%s: reserve %d bytes: %w", p.what, size, ErrInvalidValue)
	}
	p.backendAllocs++
	addr, err := p.alloc(size)
	if err != nil {
		return fmt.Errorf("%s: reserve %d bytes: %w", p.what, size, err)
	}
	p.a.addSegment(addr, size)
	return nil
}

// close releases the pool's events and segments; later calls fail with
// ErrClosed.
func (p *pool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	p.held = nil
	err := errors.Join(p.destroyEvents(), p.free())
	if err != nil {
		return fmt.Errorf("%s: close: %w", p.what, err)
	}
	return nil
}

// record records a pool-owned event on s for a free.
func (p *pool) record(s Stream) (pend, error) {
	var idx int32
	if n := len(p.idle); n > 0 {
		idx = p.idle[n-1]
		p.idle = p.idle[:n-1]
	} else {
		ev, err := p.dev.NewEvent()
		if err != nil {
			return pend{}, err
		}
		p.events = append(p.events, ownedEvent{ev: ev})
		idx = int32(len(p.events) - 1)
	}
	if err := p.dev.Record(p.events[idx].ev, s); err != nil {
		p.idle = append(p.idle, idx)
		return pend{}, err
	}
	p.events[idx].refs = 1
	p.seq++
	return pend{ev: p.events[idx].ev, s: s, seq: p.seq, owned: idx}, nil
}

// putOn frees addr behind the work queued on s so far.
func (p *pool) putOn(addr uintptr, s Stream) error {
	what := p.what
	if p.closed {
		return fmt.Errorf("%s: free %#x: %w", what, addr, ErrClosed)
	}
	b, ok := p.a.used[addr]
	if !ok {
		return fmt.Errorf("%s: free %#x: not an allocated block: %w", what, addr, ErrInvalidValue)
	}
	wasHeld := p.unhold(addr)
	e, err := p.record(s)
	if err != nil {
		return p.putUnguarded(b, s, wasHeld, err)
	}
	if !wasHeld {
		p.pl.freed(b, -1)
	}
	p.a.give(addr, e, true)
	return nil
}

// putUnguarded frees the used block b behind the work queued on s when no
// event could be made or recorded to guard it (cause): the host waits for
// s instead, after which no queued work uses the block, and it is free at
// once. Should that wait fail too, the block is held (p.held) until a later
// wait for s succeeds: handed out now, a new user could overwrite memory
// that s's work still reads or writes. Either way the block is the pool's,
// and the error, which wraps cause, names it. wasHeld: b was held already.
func (p *pool) putUnguarded(b *block, s Stream, wasHeld bool, cause error) error {
	addr, size := b.addr, b.size
	if !wasHeld {
		p.pl.freed(b, -1)
	}
	if err := p.dev.SyncStream(s); err != nil {
		p.held = append(p.held, heldBlock{addr: addr, s: s})
		return fmt.Errorf("%s: free block %#x (%d bytes) on stream %#x: record its event: %w; wait for the stream instead: %w (the block is held until the stream can be waited for)",
			p.what, addr, size, uintptr(s), cause, err)
	}
	p.a.give(addr, pend{}, false)
	return fmt.Errorf("%s: free block %#x (%d bytes) on stream %#x: record its event: %w (waited for the stream instead: the block is free)",
		p.what, addr, size, uintptr(s), cause)
}

// unhold takes the block at addr off the held list, reporting whether it
// was there: a block freed again is freed as the new call says.
func (p *pool) unhold(addr uintptr) bool {
	for i, h := range p.held {
		if h.addr == addr {
			p.held = append(p.held[:i], p.held[i+1:]...)
			return true
		}
	}
	return false
}

// retryHeld frees the held blocks whose stream the host can wait for now
// (once per stream); the others stay held.
func (p *pool) retryHeld() {
	type waited struct {
		s  Stream
		ok bool
	}
	var ws []waited
	keep := p.held[:0]
next:
	for _, h := range p.held {
		for _, w := range ws {
			if w.s == h.s {
				if w.ok {
					p.a.give(h.addr, pend{}, false)
				} else {
					keep = append(keep, h)
				}
				continue next
			}
		}
		ok := p.dev.SyncStream(h.s) == nil
		ws = append(ws, waited{h.s, ok})
		if ok {
			p.a.give(h.addr, pend{}, false)
		} else {
			keep = append(keep, h)
		}
	}
	clear(p.held[len(keep):])
	p.held = keep
}

// destroyEvents releases the pool's events on Close.
func (p *pool) destroyEvents() error {
	var first error
	for _, e := range p.events {
		if err := p.dev.DestroyEvent(e.ev); err != nil && first == nil {
			first = err
		}
	}
	p.events, p.idle = nil, nil
	return first
}

// get takes a block of at least size bytes and makes s wait for its pending
// events. A segment is added when nothing fits and growth is enabled.
// Called with p.mu held.
func (p *pool) get(size int64, s Stream) (*block, error) { return p.getAt(size, s, 0, false, false) }

// getAt is get at address at when that range is free (0: anywhere); strict,
// there or not at all. Following a layout, a block that misses its place,
// or one asked for aside, goes off the layout's pages where it can.
func (p *pool) getAt(size int64, s Stream, at uintptr, strict, aside bool) (*block, error) {
	what := p.what
	if p.closed {
		return nil, fmt.Errorf("%s: alloc %d bytes: %w", what, size, ErrClosed)
	}
	if size <= 0 {
		return nil, fmt.Errorf("%s: alloc %d bytes: %w", what, size, ErrInvalidValue)
	}
	if len(p.held) > 0 {
		p.retryHeld()
	}
	need := p.a.roundUp(size)
	ready := func(b *block) bool { return p.readyFor(b, s, need) }
	var b *block
	if at != 0 {
		var err error
		if b, err = p.takeOffset(at, need, strict); err != nil {
			return nil, err
		}
	} else if addr, alt := p.pl.spot(need); addr != 0 {
		var err error
		if b, err = p.takePlanned(addr, need); err == nil && b == nil && alt != 0 {
			b, err = p.takePlanned(alt, need)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: alloc %d bytes at its planned place: %w", what, size, err)
		}
		if b != nil {
			p.pl.placed++
		} else {
			p.pl.missed++
		}
	}
	if b == nil && (at != 0 || aside) && p.pl.following {
		var err error
		if b, err = p.takeAside(need); err != nil {
			return nil, fmt.Errorf("%s: alloc %d bytes off the layout: %w", what, size, err)
		}
	}
	switch {
	case b != nil:
	case p.mapper != nil:
		var err error
		if b, err = p.takeMapped(need, ready); err != nil {
			return nil, fmt.Errorf("%s: alloc %d bytes: %w", what, size, err)
		}
	case p.pl.placing && len(p.pl.spans) > 0:
		// A block with no place of its own keeps off the places the
		// plan needs soonest (on pages, takeMapped's pickOffPlan).
		if i, off := p.pickOffSpans(need); i >= 0 {
			b = p.a.takeFrom(i, off, need)
		}
	default:
		b = p.a.take(need, ready)
	}
	if b == nil && p.cfg.growth > 0 && p.mapper == nil {
		if err := p.grow(max(need, p.a.roundUp(p.cfg.growth))); err != nil {
			return nil, fmt.Errorf("%s: alloc %d bytes: grow: %w", what, size, err)
		}
		b = p.a.take(need, ready)
	}
	if b == nil {
		p.fails++
		st := p.a.stats()
		return nil, fmt.Errorf("%s: alloc %d bytes: largest free block %d of %d free (reserved %d): %w",
			what, size, st.LargestFree, st.Free, st.Reserved, ErrOutOfMemory)
	}
	waited, copyWait := false, false
	for _, e := range b.pending {
		if e.s == s {
			continue // same stream: FIFO order already covers it
		}
		if !e.known() && !copyWait {
			copyWait = true
			p.copyWaits++
		}
		if !waited && p.onWait != nil {
			p.onWait(s, false)
		}
		waited = true
		if err := p.dev.StreamWait(s, e.ev); err != nil {
			// The waits already queued are harmless; the block goes back
			// with its full pending list so that its next user waits again.
			p.a.give(b.addr, pend{}, false)
			return nil, fmt.Errorf("%s: alloc %d bytes: wait for pending free: %w", what, size, err)
		}
	}
	if waited && p.onWait != nil {
		p.onWait(s, true)
	}
	p.a.release(b)
	p.pl.record(b)
	return b, nil
}

// readyFor reports whether stream s can use b without a wait, judged
// without asking the device (a query is a driver call per candidate, more
// than the whole swap op costs otherwise): no event guards the block, or
// every event was recorded on s, whose FIFO order covers it. A block freed
// behind a copy on another stream is not ready: a best-fit allocator that
// handed it out would chain the new user to that copy while an idle block
// waits next to it. Only the events over the first need bytes count: the
// piece a request takes.
func (p *pool) readyFor(b *block, s Stream, need int64) bool {
	for _, e := range b.pending {
		if e.s != s && e.guards(b.addr, b.addr+uintptr(need)) {
			return false
		}
	}
	return true
}

// put frees the block at addr, guarded by ev when hasEv.
func (p *pool) put(addr uintptr, ev Event, s Stream, hasEv bool) error {
	return p.putFrom(addr, ev, s, hasEv, -1)
}

// putFrom is put for memory whose reuse the caller's schedule puts at step
// reuse (-1: at once), for planned placement.
func (p *pool) putFrom(addr uintptr, ev Event, s Stream, hasEv bool, reuse int32) error {
	what := p.what
	if p.closed {
		return fmt.Errorf("%s: free %#x: %w", what, addr, ErrClosed)
	}
	if b, ok := p.a.used[addr]; ok && !p.unhold(addr) {
		p.pl.freed(b, reuse)
	}
	b, ok := p.a.give(addr, pend{ev: ev, s: s, owned: -1}, hasEv)
	if !ok {
		return fmt.Errorf("%s: free %#x: not an allocated block: %w", what, addr, ErrInvalidValue)
	}
	if len(b.pending) > maxPending {
		p.a.prune(b, p.dev.Query)
	}
	return nil
}

func (p *pool) stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.a.stats()
	s.BackendAllocs = p.backendAllocs
	s.Placed, s.Missed, s.Placements, s.GaveUp = p.pl.totPlaced+int64(p.pl.placed), p.pl.totMissed+int64(p.pl.missed), p.pl.plans, p.pl.gaveUps
	if p.mapper != nil {
		// The memory is the page budget, not the address space.
		s.PageSize = p.page
		s.Reserved = p.a.budget * p.page
		s.Free = s.Reserved - s.Allocated
		s.Mapped = p.a.mappedPages * p.page
		s.InPages = p.a.usedPages * p.page
		s.Maps, s.Unmaps, s.HostWaits = p.maps, p.unmaps, p.syncs
		s.MappedPages, s.UnmappedPages = p.pagesIn, p.pagesOut
		s.LargestFree = min(s.LargestFree, (p.a.budget-p.a.usedPages)*p.page)
		s.Fragmentation = 0
		if s.Free > 0 {
			s.Fragmentation = 1 - float64(s.LargestFree)/float64(s.Free)
		}
	}
	return s
}

// Allocator is a caching device allocator for the swap path. It reserves
// segments from the backend up front (Reserve) and serves requests by best
// fit inside them, splitting and coalescing blocks, so that the hot path
// never calls the backend's allocator.
//
// It is stream-aware: FreeAfter returns a block whose memory is still used by
// queued work (a swap-out copy) together with the event recorded behind that
// work. Whoever reuses the memory first makes its own stream wait for the
// event on the device (StreamWait), so neither side blocks the host.
//
// An Allocator is safe for concurrent use.
type Allocator struct {
	p    pool
	segs []DevPtr
}

// NewAllocator returns an empty allocator over dev. Call Reserve before use.
func NewAllocator(dev Device, opts ...MemOption) *Allocator {
	a := &Allocator{}
	a.p.init("allocator", dev, opts)
	a.p.alloc = func(size int64) (uintptr, error) {
		ptr, err := dev.Alloc(size)
		if err == nil {
			a.segs = append(a.segs, ptr)
		}
		return uintptr(ptr), err
	}
	a.p.free = func() error {
		var errs []error
		for _, s := range a.segs {
			errs = append(errs, dev.Free(s))
		}
		a.segs = nil
		return errors.Join(errs...)
	}
	return a
}

// Reserve obtains one segment of size bytes from the backend.
func (a *Allocator) Reserve(size int64) error { return a.p.reserve(size) }

// Alloc returns size bytes of device memory (rounded up to the alignment)
// for work queued on s. If the memory was freed behind pending work, s is
// made to wait for that work first. A request that does not fit fails with
// an error wrapping ErrOutOfMemory, unless growth is enabled.
func (a *Allocator) Alloc(size int64, s Stream) (DevPtr, error) {
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	b, err := a.p.get(size, s)
	if err != nil {
		return 0, err
	}
	return DevPtr(b.addr), nil
}

// OnStreamWait sets a function told when an allocation makes its stream
// wait for memory freed behind work on another stream: called with after
// false before the first wait is queued, and with after true once the
// allocation's waits are queued (not when queuing one failed). It runs with
// the allocator's lock held and must not call the allocator. The Engine
// brackets the waits with timing events, to tell a stall from compute. nil
// turns it off.
func (a *Allocator) OnStreamWait(f func(s Stream, after bool)) {
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	a.p.onWait = f
}

// Free returns memory that no queued work uses any more.
func (a *Allocator) Free(ptr DevPtr) error {
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	return a.p.put(uintptr(ptr), 0, 0, false)
}

// FreeAfter returns memory that queued work still uses: ev must already be
// recorded on stream s behind that work. A later user on s needs no wait (s
// runs in order); a user on any other stream waits for ev on the device.
//
// The allocator keeps the handle, not a copy of the event: ev must not be
// destroyed while a free block may still refer to it (keep events in a pool
// for the allocator's lifetime), and may be recorded again only on s, which
// merely makes the next user wait for later work.
func (a *Allocator) FreeAfter(ptr DevPtr, ev Event, s Stream) error {
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	return a.p.put(uintptr(ptr), ev, s, true)
}

// FreeOn returns memory that work queued on s still uses. The allocator
// records an event of its own on s behind that work. This is the cheaper
// path: a later user on the same stream needs no wait, and frees on one
// stream collapse to the latest event when blocks coalesce.
//
// When no event can be made or recorded, the host waits for s instead and
// the memory is free at once; should that wait fail too, the allocator
// holds the memory until a wait for s succeeds (tried on each later
// request). Either way the memory is the allocator's once FreeOn returns
// (do not free it again), and the error names the block and wraps the
// device's.
func (a *Allocator) FreeOn(ptr DevPtr, s Stream) error {
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	return a.p.putOn(uintptr(ptr), s)
}

// Stats returns a snapshot of the allocator's counters.
func (a *Allocator) Stats() Stats { return a.p.stats() }

// Close returns every segment to the backend. Blocks still in use become
// invalid. Pending frees are not waited for: the backend's Free (cudaFree)
// synchronizes the device itself.
func (a *Allocator) Close() error { return a.p.close() }

// HostPool is a pool of pinned host memory for swapped-out tensors. Slabs are
// allocated up front with Reserve (cudaHostAlloc costs tens of milliseconds
// per 64 MiB) and carved like the Allocator's segments, with the same
// event-guarded reuse: a buffer given back with PutAfter behind a pending
// copy is handed out again only with a device-side wait on that copy.
//
// The wait covers device work queued on the stream passed to Get. A caller
// that touches Bytes() from the host must SyncEvent first.
//
// A HostPool is safe for concurrent use.
type HostPool struct {
	p     pool
	slabs []HostBuf
}

// NewHostPool returns an empty pool over dev. Call Reserve before use.
func NewHostPool(dev Device, opts ...MemOption) *HostPool {
	h := &HostPool{}
	h.p.init("host pool", dev, opts)
	h.p.alloc = func(size int64) (uintptr, error) {
		buf, err := dev.AllocHost(size)
		if err != nil {
			return 0, err
		}
		h.slabs = append(h.slabs, buf)
		return uintptr(buf.Ptr()), nil
	}
	h.p.free = func() error {
		var errs []error
		for _, s := range h.slabs {
			errs = append(errs, dev.FreeHost(s))
		}
		h.slabs = nil
		return errors.Join(errs...)
	}
	return h
}

// Reserve allocates one pinned slab of size bytes.
func (h *HostPool) Reserve(size int64) error { return h.p.reserve(size) }

// Get returns a pinned buffer of exactly size bytes for copies queued on s.
func (h *HostPool) Get(size int64, s Stream) (HostBuf, error) {
	h.p.mu.Lock()
	defer h.p.mu.Unlock()
	b, err := h.p.get(size, s)
	if err != nil {
		return HostBuf{}, err
	}
	seg := h.p.a.segs[b.seg]
	return h.slabs[b.seg].Slice(int64(b.addr-seg.addr), size), nil
}

// Put gives back a buffer from Get that no queued work uses.
func (h *HostPool) Put(buf HostBuf) error {
	h.p.mu.Lock()
	defer h.p.mu.Unlock()
	return h.p.put(uintptr(buf.Ptr()), 0, 0, false)
}

// PutAfter gives back a buffer that queued work still uses; ev must already
// be recorded on s behind that work, with the rules of Allocator.FreeAfter.
func (h *HostPool) PutAfter(buf HostBuf, ev Event, s Stream) error {
	h.p.mu.Lock()
	defer h.p.mu.Unlock()
	return h.p.put(uintptr(buf.Ptr()), ev, s, true)
}

// PutOn gives back a buffer that work queued on s still uses, like
// Allocator.FreeOn: when no event can be recorded the buffer is given back
// behind a host wait for s (or held until one succeeds), and it is the
// pool's once PutOn returns, error or not.
func (h *HostPool) PutOn(buf HostBuf, s Stream) error {
	h.p.mu.Lock()
	defer h.p.mu.Unlock()
	return h.p.putOn(uintptr(buf.Ptr()), s)
}

// Stats returns a snapshot of the pool's counters.
func (h *HostPool) Stats() Stats { return h.p.stats() }

// Close frees every slab. Callers must have synchronized the copies that use
// the pool: unlike cudaFree, freeing pinned memory under a running copy is
// not safe on every backend.
func (h *HostPool) Close() error { return h.p.close() }

// PageSize is the size of the pages the allocator maps (ReserveMapped), 0
// when it serves segments of memory: the unit a layout of its blocks
// counts in (plan.WithLayout).
func (a *Allocator) PageSize() int64 {
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	if a.p.mapper == nil {
		return 0
	}
	return a.p.page
}
