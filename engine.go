package chameleon

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/match"
	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/seq"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// ErrOutOfMemory is returned when a tensor cannot get device memory even
// after every idle tensor the Engine may move has been swapped out.
var ErrOutOfMemory = errors.New("chameleon: out of device memory")

// Kind says whether the Engine may move a tensor.
type Kind uint8

const (
	// Activation tensors are produced by ops and may be swapped.
	Activation Kind = iota
	// Persistent tensors (parameters, optimizer state) live across
	// iterations. The planner moves them over their idle gaps inside an
	// iteration (a weight from its layer's forward to its backward), by
	// handle rather than by matching.
	Persistent
)

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
}

type residency uint8

const (
	resident  residency = iota
	swappedIn           // resident, but the copy back may still be running: compute must wait on ready
	swapped             // bytes only on the host
)

// Tensor is a handle on device memory the Engine manages. The host reads the
// current device address with Ptr inside the op (between Before and After)
// that lists the tensor; the address may change between ops.
type Tensor struct {
	id       trace.TensorID
	size     int64
	kind     Kind
	dtype    string
	shape    []int64
	ptr      device.DevPtr
	host     device.HostBuf
	state    residency
	ready    device.Event // copy back done (state swappedIn)
	outDone  device.Event // copy out done (state swapped)
	produced bool
	released bool
	pin      uint64 // op serial during which it must stay resident
	lastUse  uint64 // op serial of its last use: the eviction order
	plan     int32  // index of the planned swap it was matched to, -1
	feat     match.Features
	slot     int // index in Engine.live
}

// Ptr is the tensor's device address. Valid inside an op that lists the
// tensor; it panics on a released tensor, the host's use-after-free.
func (t *Tensor) Ptr() device.DevPtr {
	if t.released {
		panic("chameleon: Ptr of a released tensor")
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

// Engine wires the stages for a training or inference loop: it encodes each
// op (lightweight profile), detects sequence changes, profiles in detail and
// plans when the sequence is stable, and executes the policy: swaps out
// after a tensor's last use before a gap, swaps back ahead of its next use,
// never blocking the host on the hot path.
type Engine struct {
	cfg   config
	dev   device.Device
	alloc *device.Allocator
	pool  *device.HostPool

	compute, d2h, h2d device.Stream
	ring              map[device.Stream]*eventRing

	enc *seq.Encoder
	det *seq.Detector

	tracer oteltrace.Tracer

	live    []*Tensor
	spare   []*Tensor // released handles, reused by NewTensor
	scratch []*Tensor
	nextID  trace.TensorID
	serial  uint64
	liveB   int64 // bytes of unreleased tensors, resident or not
	policy  *policy
	cache   *policyCache
	// refresh: the policy in force matches too few of its tensors; the
	// next iteration is profiled to replace it.
	refresh bool
	// seqs are the sequences seen, by signature, with how often and which
	// one came next; last is the index of the latest.
	seqs    []seqSeen
	last    int
	it      Iteration
	stats   Stats
	onClose []func() error
}

// Stats are the Engine's running totals.
type Stats struct {
	Iterations      int
	Replans         int   // policies planned from a detailed profile
	CacheHits       int   // policies reused from the cache on a sequence seen before
	StaleDrops      int   // cached policies dropped because their tensors no longer matched
	Infeasible      int   // planning runs that found no plan under the limit
	SwapsOut        int64 // copies to the host (planned and on demand)
	SwapsIn         int64
	OnDemandIn      int64 // copies back issued at the use, not ahead of it
	Evictions       int64 // swap-outs forced by a failed allocation
	SwappedOutBytes int64
	SwappedInBytes  int64
	PeakDeviceBytes int64 // highest bytes the allocator handed out
}

// New returns an Engine over dev. It reserves the memory limit on the
// device up front and creates its copy streams.
func New(dev device.Device, opts ...Option) (*Engine, error) {
	if dev == nil {
		return nil, errors.New("chameleon: nil device")
	}
	cfg := defaultConfig()
	cfg.fromEnv()
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, dev: dev, ring: map[device.Stream]*eventRing{}, cache: newPolicyCache()}
	fail := func(err error) (*Engine, error) {
		e.Close()
		return nil, err
	}
	e.alloc = device.NewAllocator(dev)
	e.onClose = append(e.onClose, e.alloc.Close)
	// A device that maps pages gets an allocator that maps them within the
	// limit: a large tensor then needs free pages, not one free range, so
	// fragmentation forces no evictions. Otherwise the limit is one
	// segment, rounded down to the allocator's block size: rounding up
	// would hand out memory above the limit.
	err := e.alloc.ReserveMapped(cfg.limit)
	if errors.Is(err, device.ErrNotSupported) {
		err = e.alloc.Reserve(cfg.limit &^ (device.BlockSize - 1))
	}
	if err != nil {
		return fail(fmt.Errorf("chameleon: reserve %d bytes of device memory: %w", cfg.limit, err))
	}
	e.pool = device.NewHostPool(dev, device.WithGrowth(64<<20))
	e.onClose = append(e.onClose, e.pool.Close)
	if cfg.hostReserve > 0 {
		if err := e.pool.Reserve(cfg.hostReserve); err != nil {
			return fail(fmt.Errorf("chameleon: reserve %d bytes of pinned host memory: %w", cfg.hostReserve, err))
		}
	}
	e.compute = dev.DefaultStream()
	for _, s := range []*device.Stream{&e.d2h, &e.h2d} {
		st, err := dev.NewStream()
		if err != nil {
			return fail(fmt.Errorf("chameleon: copy stream: %w", err))
		}
		*s = st
		e.onClose = append(e.onClose, func() error { return dev.DestroyStream(st) })
	}
	for _, s := range []device.Stream{e.compute, e.d2h, e.h2d} {
		r, err := newEventRing(dev, s, 256)
		if err != nil {
			return fail(err)
		}
		e.ring[s] = r
		e.onClose = append(e.onClose, r.close)
	}
	det, err := seq.NewDetector(cfg.detect)
	if err != nil {
		return fail(err)
	}
	e.det = det
	e.enc = seq.NewEncoder(nil)
	if cfg.policyFile != "" {
		if err := e.LoadPolicyFile(cfg.policyFile); err != nil {
			return fail(err)
		}
	}
	e.tracer = cfg.tp.Tracer("github.com/chameleon-go/chameleon")
	e.it.eng = e
	e.last = -1
	return e, nil
}

// Close releases the Engine's streams, events and memory pools. Tensors
// still held are invalid afterwards.
func (e *Engine) Close() error {
	var errs []error
	for i := len(e.onClose) - 1; i >= 0; i-- {
		errs = append(errs, e.onClose[i]())
	}
	e.onClose = nil
	return errors.Join(errs...)
}

// Stats returns the running totals.
func (e *Engine) Stats() Stats {
	s := e.stats
	s.PeakDeviceBytes = e.alloc.Stats().PeakAllocated
	return s
}

// Stage is the stage the next iteration runs in.
func (e *Engine) Stage() seq.Stage { return e.det.Next() }

// ComputeStream is the stream the host must run its kernels on: the
// Engine's waits for swapped-in tensors are queued on it.
func (e *Engine) ComputeStream() device.Stream { return e.compute }

// Device is the device the Engine runs on.
func (e *Engine) Device() device.Device { return e.dev }

// NewTensor allocates an Engine-managed tensor of size bytes. Activations
// are allocated by the host right before the op that produces them (listed
// in its Out); persistent tensors at any time.
func (e *Engine) NewTensor(size int64, kind Kind, dtype string, shape []int64) (*Tensor, error) {
	if size <= 0 {
		return nil, fmt.Errorf("chameleon: tensor of %d bytes", size)
	}
	var t *Tensor
	if n := len(e.spare); n > 0 {
		t, e.spare = e.spare[n-1], e.spare[:n-1]
		*t = Tensor{}
	} else {
		t = new(Tensor)
	}
	t.id, t.size, t.kind, t.dtype, t.shape, t.plan = e.nextID, size, kind, dtype, shape, -1
	e.nextID++
	e.serial++
	t.pin = e.serial // not evictable while its own allocation runs
	ptr, err := e.allocate(size, e.compute)
	if err != nil {
		e.spare = append(e.spare, t)
		return nil, err
	}
	t.ptr = ptr
	t.lastUse = e.serial
	t.slot = len(e.live)
	e.live = append(e.live, t)
	e.liveB += size
	if kind == Persistent {
		t.produced = true
	}
	return t, nil
}

// Release returns a tensor's memory. The device memory is reused only after
// the work already queued on it completes (an event, not a host wait). The
// handle must not be used afterwards: the Engine recycles it for a later
// NewTensor, which keeps the steady state free of heap allocations.
func (e *Engine) Release(t *Tensor) error {
	if t == nil || t.released {
		return nil
	}
	t.released = true
	if t.kind == Activation && (e.policy == nil || t.plan < 0) {
		// A tensor a policy matched is not reused: the policy may still
		// point at it. Nor are persistent handles: cached policies name
		// them directly.
		e.spare = append(e.spare, t)
	}
	e.liveB -= t.size
	last := e.live[len(e.live)-1]
	e.live[t.slot], last.slot = last, t.slot
	e.live = e.live[:len(e.live)-1]
	switch t.state {
	case resident:
		return e.alloc.FreeOn(t.ptr, e.compute)
	case swappedIn:
		// Compute never waited on the copy back: free behind the copy.
		return e.alloc.FreeAfter(t.ptr, t.ready, e.h2d)
	default:
		return e.pool.PutAfter(t.host, t.outDone, e.d2h)
	}
}

// allocate gets device memory for stream s, swapping out idle tensors
// (see victims) while no free block fits.
func (e *Engine) allocate(size int64, s device.Stream) (device.DevPtr, error) {
	for {
		ptr, err := e.alloc.Alloc(size, s)
		if err == nil {
			return ptr, nil
		}
		if !errors.Is(err, device.ErrOutOfMemory) {
			return 0, err
		}
		vs := e.victims(size)
		if len(vs) == 0 {
			st := e.alloc.Stats()
			return 0, fmt.Errorf("%w: %d bytes wanted; %d of %d in use by tensors the current op needs or that cannot move (largest free block %d)",
				ErrOutOfMemory, size, st.Allocated, st.Reserved, st.LargestFree)
		}
		for _, v := range vs {
			if err := e.swapOut(v); err != nil {
				return 0, err
			}
			e.stats.Evictions++
		}
		if l := e.cfg.evictLog; l != nil {
			st := e.alloc.Stats()
			l.Debug("evict", "op", e.it.op, "want", size, "victims", len(vs), "allocated", st.Allocated,
				"reserved", st.Reserved, "largest_free", st.LargestFree, "live_bytes", e.liveB)
		}
	}
}

// victims picks the tensors to swap out when an allocation of want bytes
// fails. Enough free bytes are not enough: the request needs one free run
// of addresses, which only the allocator can see (its segments, free blocks
// and rounding), so it chooses the window: the run of resident tensors,
// none pinned by the current op, whose removal joins the free gaps around
// them into a block of at least want bytes, with the fewest bytes to move;
// among equal windows the least recently used. Persistent tensors qualify
// too: optimizer state sits idle through forward and backward, and moving
// it is what lets a tight limit hold an op's working set. No window means
// no eviction can make the request fit.
func (e *Engine) victims(want int64) []*Tensor {
	res := e.scratch[:0]
	for _, t := range e.live {
		if t.state != swapped {
			res = append(res, t)
		}
	}
	e.scratch = res
	blocks := make([]device.Resident, len(res))
	for i, t := range res {
		blocks[i] = device.Resident{Ptr: t.ptr, Movable: t.pin != e.serial, Cost: t.size, Age: t.lastUse}
	}
	idx, ok, err := e.alloc.EvictionWindow(want, blocks, nil)
	if err != nil || !ok || len(idx) == 0 {
		return nil
	}
	vs := make([]*Tensor, len(idx))
	for i, k := range idx {
		vs[i] = res[k]
	}
	return vs
}

// swapOut copies t to pinned host memory on the d2h stream after the
// compute stream's work so far, and frees its device memory behind the copy.
func (e *Engine) swapOut(t *Tensor) error {
	if t.state == swapped {
		return nil
	}
	after := e.ring[e.compute].next()
	if t.state == swappedIn {
		// Still arriving: the copy out must follow the copy back.
		if err := e.dev.StreamWait(e.d2h, t.ready); err != nil {
			return err
		}
	}
	if err := e.dev.Record(after, e.compute); err != nil {
		return err
	}
	if err := e.dev.StreamWait(e.d2h, after); err != nil {
		return err
	}
	buf, err := e.pool.Get(t.size, e.d2h)
	if err != nil {
		return fmt.Errorf("chameleon: pinned buffer for tensor %d (%d bytes): %w", t.id, t.size, err)
	}
	if err := e.dev.CopyD2H(buf, t.ptr, e.d2h); err != nil {
		return err
	}
	done := e.ring[e.d2h].next()
	if err := e.dev.Record(done, e.d2h); err != nil {
		return err
	}
	if err := e.alloc.FreeAfter(t.ptr, done, e.d2h); err != nil {
		return err
	}
	t.host, t.outDone, t.state, t.ptr = buf, done, swapped, 0
	e.stats.SwapsOut++
	e.stats.SwappedOutBytes += t.size
	return nil
}

// swapIn allocates device memory for t and queues the copy back on the h2d
// stream; compute waits for it only at t's next use. A prefetch (evict
// false) does not push other tensors out to make room: it reports false and
// is tried again at the next op, or at the use.
func (e *Engine) swapIn(t *Tensor, evict bool) (bool, error) {
	if t.state != swapped {
		return true, nil
	}
	var ptr device.DevPtr
	var err error
	if evict {
		ptr, err = e.allocate(t.size, e.h2d)
	} else {
		ptr, err = e.alloc.Alloc(t.size, e.h2d)
		if errors.Is(err, device.ErrOutOfMemory) {
			return false, nil
		}
	}
	if err != nil {
		return false, fmt.Errorf("chameleon: swap in tensor %d: %w", t.id, err)
	}
	if err := e.dev.StreamWait(e.h2d, t.outDone); err != nil {
		return false, err
	}
	if err := e.dev.CopyH2D(ptr, t.host, e.h2d); err != nil {
		return false, err
	}
	ready := e.ring[e.h2d].next()
	if err := e.dev.Record(ready, e.h2d); err != nil {
		return false, err
	}
	if err := e.pool.PutAfter(t.host, ready, e.h2d); err != nil {
		return false, err
	}
	t.ptr, t.ready, t.state, t.host = ptr, ready, swappedIn, device.HostBuf{}
	e.stats.SwapsIn++
	e.stats.SwappedInBytes += t.size
	return true, nil
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

// policy is a plan in force: what to swap, matched to live tensors by
// features, scheduled by op index.
type policy struct {
	key   policyKey
	swaps []simulate.Swap
	feats []match.Features
	names []plannedProducer // for saving: the producer's name, the call site
	// fixed holds, per swap, the persistent tensor it moves (parameters,
	// optimizer state keep their handle across iterations, so they need no
	// matching), nil for a swap of an activation, found by matching.
	fixed    []*Tensor
	outAt    map[int][]int32
	inAt     map[int][]int32
	matcher  *match.Matcher
	matchIdx []int32 // matcher index -> swap index
	live     []*Tensor
	matched  int
}

type plannedProducer struct {
	Name, Overload, Module string
	Shape                  []int64
}

// newPolicy indexes a plan's swaps by the op they are issued at; fixed may
// be nil (no persistent tensor among the swaps), and so may sim (issue each
// copy at the plan's Out and In).
func newPolicy(key policyKey, cfg match.Config, swaps []simulate.Swap, feats []match.Features, names []plannedProducer, fixed []*Tensor, sim *simulate.Result) *policy {
	if fixed == nil {
		fixed = make([]*Tensor, len(swaps))
	}
	p := &policy{key: key, swaps: swaps, feats: feats, names: names, fixed: fixed,
		outAt: map[int][]int32{}, inAt: map[int][]int32{}, live: make([]*Tensor, len(swaps))}
	// Copy streams run copies in issue order; the plan's simulation serves
	// the most urgent issued copy first. Issue the copies when, and in the
	// order, the simulation started them, so the streams run the plan.
	ip := simulate.Issue(swaps, sim)
	var mf []match.Features
	for _, i := range ip.OutOrder {
		p.outAt[ip.OutOp[i]] = append(p.outAt[ip.OutOp[i]], int32(i))
	}
	for _, i := range ip.InOrder {
		p.inAt[ip.InOp[i]] = append(p.inAt[ip.InOp[i]], int32(i))
	}
	for i := range swaps {
		if fixed[i] == nil {
			mf = append(mf, feats[i])
			p.matchIdx = append(p.matchIdx, int32(i))
		}
	}
	p.matcher = match.New(cfg, mf)
	return p
}

// reset starts an iteration: activations are matched afresh, persistent
// tensors are known.
func (p *policy) reset() {
	p.matcher.Reset()
	clear(p.live)
	p.matched = 0
	for i, t := range p.fixed {
		if t != nil && !t.released {
			p.live[i], t.plan = t, int32(i)
			p.matched++
		}
	}
}

// seqSeen is one sequence signature in the Engine's history. A sequence
// that keeps coming back without ever holding for M iterations in a row
// (fp16 skipped steps alternating with real ones, a cycle of sequence
// lengths) never reaches GEN_POLICY; counting its occurrences and what
// follows what lets the Engine profile the iteration it expects next and
// plan for it once it has been seen M times.
type seqSeen struct {
	key    policyKey
	count  int
	next   int  // index of the sequence that followed it last, -1
	failed bool // planning found no policy for it: not retried
}

// seqIndex finds the history entry of k (same rule as the policy cache)
// or adds one.
func (e *Engine) seqIndex(k policyKey) int {
	for i, s := range e.seqs {
		if k.same(s.key, e.cfg.detect.MaxMemoryDelta) {
			return i
		}
	}
	e.seqs = append(e.seqs, seqSeen{key: k, next: -1})
	return len(e.seqs) - 1
}

// profileNext decides whether the coming iteration is profiled in detail:
// when no policy covers the current sequence and it has held through
// WARMUP, or when the sequence expected next recurs often enough and has no
// policy yet.
func (e *Engine) profileNext() bool {
	if e.refresh {
		return true
	}
	var cur *seqSeen
	if e.last >= 0 {
		cur = &e.seqs[e.last]
	}
	if e.policy == nil && e.det.Next() != seq.Warmup && (cur == nil || !cur.failed) {
		return true
	}
	if cur == nil || cur.next < 0 {
		return false
	}
	n := &e.seqs[cur.next]
	return n.count >= e.cfg.detect.M && !n.failed && e.cache.get(n.key, e.cfg.detect.MaxMemoryDelta) == nil
}

// Iteration is one pass of the host's loop through the Engine.
type Iteration struct {
	eng    *Engine
	index  int
	op     int
	start  int64 // clock at Begin, ns
	detail *trace.Iteration
	span   oteltrace.Span
	ctx    context.Context
	// prefetches that found no free block yet, retried at each op
	deferred []int32
	// per-iteration execution counts
	swapsOut, swapsIn, onDemand int64
	bytesOut                    int64
}

// Begin starts an iteration. The returned Iteration is reused by the
// Engine: it is valid until End.
func (e *Engine) Begin() *Iteration {
	it := &e.it
	*it = Iteration{eng: e, index: e.stats.Iterations, start: e.cfg.clock().UnixNano(), deferred: it.deferred[:0]}
	it.ctx, it.span = e.tracer.Start(context.Background(), "chameleon.execute")
	if e.profileNext() {
		it.detail = &trace.Iteration{Index: it.index, Tensors: map[trace.TensorID]*trace.Tensor{}}
	}
	if e.policy != nil {
		e.policy.reset()
	}
	return it
}

// Before prepares op: its inputs are resident (any wait is queued on the
// compute stream, not on the host) and the swap-ins the policy issues at
// this op are started.
func (it *Iteration) Before(op *Op) error {
	e := it.eng
	e.serial++
	for _, t := range op.In {
		t.pin = e.serial
	}
	for _, t := range op.Out {
		t.pin = e.serial
	}
	if p := e.policy; p != nil {
		it.deferred = append(it.deferred, p.inAt[it.op]...)
		kept := it.deferred[:0]
		for _, k := range it.deferred {
			t := p.live[k]
			if t == nil || t.released || t.state != swapped {
				continue
			}
			ok, err := e.swapIn(t, false)
			if err != nil {
				return fmt.Errorf("op %d (%s): %w", it.op, op.Name, err)
			}
			if !ok {
				kept = append(kept, k)
				continue
			}
			it.swapsIn++
		}
		it.deferred = kept
	}
	if err := it.resident(op, op.In); err != nil {
		return err
	}
	return it.resident(op, op.Out)
}

func (it *Iteration) resident(op *Op, ts []*Tensor) error {
	e := it.eng
	for _, t := range ts {
		if t.released {
			return fmt.Errorf("chameleon: op %d (%s) uses released tensor %d", it.op, op.Name, t.id)
		}
		if t.state == swapped {
			if _, err := e.swapIn(t, true); err != nil {
				return fmt.Errorf("op %d (%s): %w", it.op, op.Name, err)
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
		t.lastUse = e.serial
	}
	return nil
}

// After records op and starts the swap-outs the policy schedules after it.
func (it *Iteration) After(op *Op) error {
	e := it.eng
	var fresh int64
	for _, t := range op.Out {
		if !t.produced {
			fresh += t.size
		}
	}
	tok := e.enc.Record(op.Name, op.Overload, fresh)
	p := e.policy
	if fresh > 0 {
		// Features are needed to match a policy's tensors, or to plan one
		// from this iteration's profile; otherwise hashing is wasted.
		need := p != nil || it.detail != nil
		var stack uint64
		if need {
			stack = match.Hash(op.Module)
		}
		for _, t := range op.Out {
			if t.produced {
				continue
			}
			t.produced = true
			if !need {
				continue
			}
			t.feat = match.Features{Ptr: uint64(t.ptr), Stack: stack, Producer: uint32(tok), Shape: match.ShapeHash(t.shape)}
			if p != nil {
				if k, _ := p.matcher.Match(t.feat); k >= 0 {
					sw := p.matchIdx[k]
					p.live[sw], t.plan = t, sw
					p.matched++
				}
			}
		}
	}
	if it.detail != nil {
		it.record(op)
	}
	if p != nil {
		for _, k := range p.outAt[it.op] {
			if t := p.live[k]; t != nil && !t.released && t.state != swapped {
				if err := e.swapOut(t); err != nil {
					return fmt.Errorf("op %d (%s): %w", it.op, op.Name, err)
				}
				it.swapsOut++
				it.bytesOut += t.size
			}
		}
	}
	it.op++
	return nil
}

// record appends op to the detailed profile.
func (it *Iteration) record(op *Op) {
	e := it.eng
	ids := func(ts []*Tensor) []trace.TensorID {
		out := make([]trace.TensorID, len(ts))
		for i, t := range ts {
			out[i] = t.id
			if _, ok := it.detail.Tensors[t.id]; !ok {
				k := trace.KindActivation
				if t.kind == Persistent {
					k = trace.KindParam
				}
				it.detail.Tensors[t.id] = &trace.Tensor{ID: t.id, Bytes: t.size, DType: t.dtype, Shape: t.shape, Kind: k, Ptr: t.feat.Ptr}
			}
		}
		return out
	}
	it.detail.Ops = append(it.detail.Ops, trace.Op{
		Seq: it.op, Name: op.Name, Overload: op.Overload, Phase: op.Phase, Module: op.Module,
		In: ids(op.In), Out: ids(op.Out), Mem: e.liveB, FLOPs: op.FLOPs, IOBytes: op.Bytes,
	})
}

// Result is what End reports about an iteration.
type Result struct {
	Index     int
	Ops       int
	Stage     seq.Stage // the stage this iteration ran in
	Detect    seq.Result
	Planned   bool  // a policy was planned from this iteration's profile
	CacheHit  bool  // a cached policy was adopted for the next iterations
	Matched   int   // planned tensors matched to live ones
	SwapsOut  int64 // copies to the host this iteration
	SwapsIn   int64
	OnDemand  int64 // copies back issued at the use
	BytesOut  int64
	PlanError error // why planning found no policy, if it ran and failed
}

// End closes the iteration: Detect, and when the stage says so, Group,
// Plan and Simulate the next policy (or adopt a cached one).
func (it *Iteration) End() Result {
	e := it.eng
	end := e.cfg.clock().UnixNano()
	ctx := it.ctx
	_, encSpan := e.tracer.Start(ctx, "chameleon.encode")
	prof := e.enc.Finish()
	encSpan.SetAttributes(attribute.Int("ops", prof.Len), attribute.Int64("bytes", prof.Bytes))
	encSpan.End()

	_, detSpan := e.tracer.Start(ctx, "chameleon.detect")
	res := e.det.Observe(prof)
	detSpan.SetAttributes(attribute.Bool("changed", res.Changed), attribute.String("stage", res.Stage.String()),
		attribute.Float64("similarity", res.Similarity))
	detSpan.End()

	r := Result{Index: it.index, Ops: prof.Len, Stage: res.Stage, Detect: res,
		SwapsOut: it.swapsOut, SwapsIn: it.swapsIn, OnDemand: it.onDemand, BytesOut: it.bytesOut}
	key := policyKey{Hash: prof.Hash, Ops: prof.Len, Bytes: prof.Bytes}
	si := e.seqIndex(key)
	e.seqs[si].count++
	if e.last >= 0 {
		e.seqs[e.last].next = si
	}
	e.last = si
	cur := &e.seqs[si]
	if p := e.policy; p != nil {
		r.Matched = p.matched
		switch {
		case res.Changed:
			e.policy, e.refresh = nil, false
		case len(p.swaps) > 0 && float64(p.matched) < e.cfg.staleMatch*float64(len(p.swaps)):
			// Same sequence, but the tensors no longer match the plan (MoE
			// routing moved them). The entry leaves the cache; the policy
			// keeps serving what it still matches while the next iteration
			// is profiled to plan afresh, with no return to WARMUP.
			if !e.refresh {
				e.cache.drop(p.key)
				e.stats.StaleDrops++
			}
			e.refresh = true
		}
	}
	if e.policy == nil {
		if pol := e.cache.get(key, e.cfg.detect.MaxMemoryDelta); pol != nil {
			e.policy = pol
			e.det.Adopt()
			r.CacheHit = true
			e.stats.CacheHits++
		}
	}
	recurring := cur.count > e.cfg.detect.M
	if (e.policy == nil || e.refresh) && it.detail != nil && (!res.Changed || recurring) && !cur.failed {
		e.refresh = false
		it.detail.TimeMS = float64(end-it.start) / 1e6
		if pol, err := e.plan(ctx, it.detail, key); err != nil {
			// Not again for this sequence: the forced swap-outs of the
			// executor keep its iterations under the limit meanwhile.
			cur.failed = true
			r.PlanError = err
			e.stats.Infeasible++
			e.cfg.logger.Debug("chameleon: no policy", "iteration", it.index, "err", err)
		} else {
			e.policy = pol
			e.cache.put(pol)
			r.Planned = true
			e.stats.Replans++
			if res.Changed {
				e.det.Adopt() // a recurring sequence: planned, no warm-up needed
			}
		}
	}
	it.span.SetAttributes(attribute.Int("iteration", it.index), attribute.Int("ops", prof.Len),
		attribute.Int64("swaps_out", it.swapsOut), attribute.Int64("swaps_in", it.swapsIn),
		attribute.Int64("bytes_out", it.bytesOut), attribute.Int64("on_demand_in", it.onDemand),
		attribute.String("stage", res.Stage.String()))
	it.span.End()
	e.stats.Iterations++
	return r
}

// plan runs Group, Plan and Simulate on a detailed profile.
func (e *Engine) plan(ctx context.Context, it *trace.Iteration, key policyKey) (*policy, error) {
	_, gs := e.tracer.Start(ctx, "chameleon.group")
	live := make(map[trace.TensorID]bool, len(e.live))
	for _, t := range e.live {
		live[t.id] = true
	}
	model := memory.Build(it, func(id trace.TensorID) bool { return live[id] })
	groups := layer.Layers(it.Ops, e.cfg.groups)
	times := e.cfg.estimator.Estimate(it)
	gs.SetAttributes(attribute.Int("ops", len(it.Ops)), attribute.Int("groups", len(groups)),
		attribute.Int64("peak_bytes", model.Peak))
	gs.End()

	_, ps := e.tracer.Start(ctx, "chameleon.plan")
	// Plan for 90% of the limit first, then 95%, then the limit itself: the
	// allocator needs contiguous blocks, and a plan that fills the limit to
	// the byte leaves none (each miss is a forced, synchronous swap; on the
	// llama16 replay at 80% the 90% tier has a quarter fewer than 95%).
	var pol *mre.Policy
	var err error
	for _, limit := range []int64{e.cfg.limit * 90 / 100, e.cfg.limit * 95 / 100, e.cfg.limit} {
		in := mre.Input{Model: model, Curve: model.Curve, OpTimes: times, Groups: groups, Limit: limit}
		if e.cfg.planner != nil {
			pol, err = e.cfg.planner.Plan(in)
		} else {
			pol, err = mre.Plan(in, mre.WithScoreWeight(e.cfg.scoreC), mre.WithPrefetchLayers(e.cfg.prefetch),
				mre.WithLink(e.cfg.link), mre.WithMinBytes(e.cfg.minSwap))
		}
		if err == nil || !errors.Is(err, mre.ErrInfeasible) {
			break
		}
	}
	if err != nil {
		ps.RecordError(err)
		ps.SetStatus(codes.Error, err.Error())
		ps.End()
		return nil, err
	}
	var bytes int64
	for _, s := range pol.Swaps {
		bytes += s.Bytes
	}
	ps.SetAttributes(attribute.Int("swaps", len(pol.Swaps)), attribute.Int64("bytes", bytes), attribute.Int64("limit", e.cfg.limit))
	ps.End()

	_, ss := e.tracer.Start(ctx, "chameleon.simulate")
	sim, err := simulate.Run(simulate.Input{OpTimes: times, Curve: model.Curve, Swaps: pol.Swaps, Link: e.cfg.link})
	if err != nil {
		ss.RecordError(err)
		ss.End()
		return nil, err
	}
	ss.SetAttributes(attribute.Float64("iteration_us", sim.IterationUS), attribute.Float64("stall_us", sim.StallUS),
		attribute.Float64("overhead_pct", sim.OverheadPct()))
	ss.End()

	swaps := slices.Clone(pol.Swaps)
	feats := make([]match.Features, len(swaps))
	names := make([]plannedProducer, len(swaps))
	producer := make(map[trace.TensorID]int, len(it.Tensors))
	for i := range it.Ops {
		for _, id := range it.Ops[i].Out {
			if _, ok := producer[id]; !ok {
				producer[id] = i
			}
		}
	}
	persistent := make(map[trace.TensorID]*Tensor)
	for _, t := range e.live {
		if t.kind == Persistent {
			persistent[t.id] = t
		}
	}
	fixed := make([]*Tensor, len(swaps))
	for i, s := range swaps {
		if t := persistent[s.Tensor]; t != nil {
			fixed[i] = t
			continue
		}
		t := it.Tensors[s.Tensor]
		op := &it.Ops[producer[s.Tensor]]
		feats[i] = match.Features{Ptr: t.Ptr, Stack: match.Hash(op.Module),
			Producer: uint32(e.enc.Vocab.Token(op.Name, op.Overload)), Shape: match.ShapeHash(t.Shape)}
		names[i] = plannedProducer{Name: op.Name, Overload: op.Overload, Module: op.Module, Shape: t.Shape}
	}
	return newPolicy(key, e.cfg.match, swaps, feats, names, fixed, pol.Sim), nil
}
