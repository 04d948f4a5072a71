package chameleon

import (
	"context"
	"errors"
	"fmt"
	"sync"

	oteltrace "go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/internal/controller"
	"github.com/chameleon-go/chameleon/match"
	"github.com/chameleon-go/chameleon/seq"
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
	// even those the host releases before it.
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
	ready   device.Event // copy back done (state swappedIn)
	outDone device.Event // copy out done (state swapped)
	// kept: resident again, t still holds the host copy it came back from,
	// which stays current until an op writes t (lists it in Out): a swap
	// out until then releases the device memory and copies nothing.
	kept bool
	// keepHost: keep the host copy at the coming swap-in (policy.keepIn).
	keepHost bool
	produced bool
	// written: a Frozen tensor's bytes were set (Fill, or its first op).
	written  bool
	released bool
	pin      uint64  // op serial during which it must stay resident
	lastUse  uint64  // op serial of its last use: the eviction order
	plan     int32   // index of the planned swap it was matched to, -1
	rc       int32   // index of the planned recompute it was matched to, -1
	holds    int32   // recomputes still to run that read it: its memory stays
	remake   int32   // recomputes still to run that make it again: its handle stays
	rm       int32   // index of the planned remade input it was matched to, -1
	eng      *Engine // the Engine that made it
	feat     match.Features
	slot     int // index in Engine.live
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
	det Detector

	tracer oteltrace.Tracer

	// mu serializes every call: see the package documentation.
	mu sync.Mutex
	// inOp is set between an op's Before and After: a tensor allocated
	// meanwhile must not unpin that op's tensors.
	inOp bool

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
	liveB  int64
	policy *policy
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
	cache              *policyCache
	// ctl decides which policy is in force, when to profile and plan
	// (internal/controller); no other code writes its state.
	ctl     *controller.Controller
	closed  bool
	it      Iteration
	stats   Stats
	onClose []func() error
	// policyErr is why WithPolicyFile's file was not used.
	policyErr error
	// restart is the policy of the sequence a policy file saved last,
	// applied from the first iteration (nil: none).
	restart *policy
	// policies numbers the policies put in force (policy.id).
	policies uint64
	// job is the plan in flight on the worker (nil: none), sends rank 0's
	// broadcasts in flight; work is canceled by Close (stop), workers
	// runs them.
	job     *planJob
	sends   []*sendJob
	work    context.Context
	stop    context.CancelFunc
	workers errgroup.Group
	rank    rankState // WithRank's exchanges
	// prefetches are the tensors Prefetch was asked for that found no
	// free device memory yet: tried again at each op and after each Evict.
	prefetches []*Tensor
	tm         *timer // timing events and what they measured (timing.go)
}

// Detector is the Detect stage: it sees each iteration's lightweight
// profile, says whether the sequence changed and which stage the next
// iteration runs in, and adopts a policy found without a warm-up (a
// cached one, or one planned for a recurring sequence). The default is
// seq.Detector over WithDetection's settings.
type Detector interface {
	Observe(p seq.Profile) seq.Result
	Next() seq.Stage
	Adopt()
}

// Stats are the Engine's running totals.
type Stats struct {
	Iterations int
	Replans    int // policies planned from a detailed profile (a replacement for placement: Tightened)
	CacheHits  int // policies reused from the cache on a sequence seen before
	// Expected counts the cached policies applied to an iteration before
	// it ran, for the sequence expected next (a run as long as its last
	// one ended: what followed that run).
	Expected      int
	StaleDrops    int // cached policies dropped because their tensors no longer matched
	PolicyUpdates int // cached policies updated to another limit, link or device (a differential update, not a replan)
	// Outgrown counts policies an iteration outgrew: its bytes grew past
	// the profile they were planned from and it forced evictions past a
	// twentieth of the planned swaps. Each is planned again from the next
	// iteration's profile, staying STABLE (a decode loop's growing cache).
	Outgrown int
	// Tightened counts policies planned again below the limit because
	// the blocks of the one in force needed more pages than the limit
	// holds (the allocator refused to place them, or moved pages each step
	// for them; WithPlacement): each aims lower by the share that would
	// have fit, down to 90% of the limit. They are not counted in Replans.
	Tightened int
	// Refined counts policies planned again from the profile of an
	// iteration they ran without forcing an eviction, having been
	// planned on times measured under forced evictions (a sequence's
	// first profile, with no policy in force: the evictions' copies slow
	// the kernels they run beside). Once per sequence; each is in Replans.
	Refined    int
	Infeasible int   // planning runs that found no plan under the limit
	SwapsOut   int64 // copies to the host (planned and on demand)
	SwapsIn    int64
	OnDemandIn int64 // copies back issued at the use, not ahead of it
	Evictions  int64 // swap-outs forced by a failed allocation
	// Relocated counts the parameters and optimizer state moved on the
	// device (one copy each) to where a new policy's layout has them.
	Relocated       int64
	SwappedOutBytes int64
	SwappedInBytes  int64
	Recomputes      int64 // tensors dropped and made again by running their producer
	PeakDeviceBytes int64 // highest bytes the allocator handed out
	// DeviceBytes and HostBytes are what the Engine holds now: device memory
	// handed out (block-rounded) and pinned host buffers in use.
	DeviceBytes, HostBytes int64
	// Maps, Unmaps and HostWaits are the device allocator's (device.Stats):
	// page mappings made and undone, and the times the host waited for
	// queued work to unmap a range. All three stay flat once a policy runs
	// as planned; a host wait stalls the host's queueing of work.
	Maps, Unmaps, HostWaits int64
	// MappedPages counts the pages those maps mapped (device.Stats).
	MappedPages int64
	// Placed and Missed count the device blocks of STABLE iterations
	// served at the address planned for them (WithPlacement) and, with a
	// plan, elsewhere; Placements the plans the allocator made.
	Placed, Missed, Placements int64
	// DriftReplans counts the times a logical layer's sampled time drifted
	// from its policy's (WithDriftThreshold) and the Engine planned again;
	// MeasuredPlans the policies planned on measured layer times;
	// TimedIterations the iterations whose timing events were read;
	// TimingErrors the device errors that left an iteration's times to the
	// estimator (each logged as a warning).
	DriftReplans, MeasuredPlans, TimedIterations, TimingErrors int
	// KeptEvictions counts swap-outs (in SwapsOut) of tensors whose host
	// copy was still current (parameters, optimizer state, and activations
	// the plan swaps out again, that no op had written since they came
	// back): device memory released, nothing copied;
	// KeptBytes their bytes, which SwappedOutBytes does not count.
	KeptEvictions, KeptBytes int64
	// PeakHostBytes is the most pinned host memory in use at once.
	PeakHostBytes int64
	// HostAllocs counts the pinned slabs the host pool allocated (each a
	// cudaHostAlloc on CUDA, slow: it pins the pages): flat once the pool
	// holds what a policy's swaps need at once.
	HostAllocs int64
	// With WithRank: AdoptedPolicies counts the policies rank 0 planned
	// that this rank adopted instead of planning, SharedPolicies those rank
	// 0 broadcast, RankFallbacks the exchanges after which this rank
	// planned on its own (rank 0 had no policy for its sequence, or the
	// broadcast failed or timed out).
	AdoptedPolicies, SharedPolicies, RankFallbacks int
	// HintEvictions counts the tensors Evict moved off the device (copied
	// or, with a current host copy, released: in SwapsOut either way),
	// HintEvictedBytes their bytes. HintPrefetches counts the copies back
	// Prefetch started (in SwapsIn); HintDeferrals the prefetches that
	// found no free device memory at once and waited for some.
	HintEvictions, HintEvictedBytes, HintPrefetches, HintDeferrals int64
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
	cfg.planning = cfg.planPath()
	e := &Engine{cfg: cfg, dev: dev, ring: map[device.Stream]*eventRing{}, cache: newPolicyCache()}
	e.work, e.stop = context.WithCancel(context.Background())
	e.ctl = controller.New(controller.Config{M: cfg.detect.M, MemDelta: cfg.detect.MaxMemoryDelta, StaleMatch: cfg.staleMatch,
		Limit: cfg.limit, NoPlace: cfg.noPlace, Ranks: cfg.ranks.active()})
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
	poolOpts, hostReserve := cfg.hostPool()
	e.pool = device.NewHostPool(dev, poolOpts...)
	e.onClose = append(e.onClose, e.pool.Close)
	if hostReserve > 0 {
		if err := e.pool.Reserve(hostReserve); err != nil {
			return fail(fmt.Errorf("chameleon: reserve %d bytes of pinned host memory: %w", hostReserve, err))
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
	e.tm = newTimer(e)
	e.det = cfg.detector
	if e.det == nil {
		det, err := seq.NewDetector(cfg.detect)
		if err != nil {
			return fail(err)
		}
		e.det = det
	}
	e.enc = seq.NewEncoder(nil)
	if cfg.policyFile != "" {
		if err := e.openPolicyFile(); err != nil {
			return fail(err)
		}
	}
	e.tracer = cfg.tp.Tracer("github.com/chameleon-go/chameleon")
	e.it.eng = e
	return e, nil
}

// Close releases the Engine's streams, events and memory pools. Tensors
// still held are invalid afterwards.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	e.waitWork()
	var errs []error
	for i := len(e.onClose) - 1; i >= 0; i-- {
		errs = append(errs, e.onClose[i]())
	}
	e.onClose = nil
	return errors.Join(errs...)
}

// Stats returns the running totals.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.stats
	a := e.alloc.Stats()
	s.PeakDeviceBytes, s.DeviceBytes = a.PeakAllocated, a.Allocated
	s.Maps, s.Unmaps, s.HostWaits = a.Maps, a.Unmaps, a.HostWaits
	s.MappedPages = a.MappedPages
	s.Placed, s.Missed, s.Placements = a.Placed, a.Missed, a.Placements
	hs := e.pool.Stats()
	s.HostBytes, s.PeakHostBytes, s.HostAllocs = hs.Allocated, hs.PeakAllocated, hs.BackendAllocs
	return s
}

// Stage is the stage the next iteration runs in.
func (e *Engine) Stage() seq.Stage {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.det.Next()
}

// ComputeStream is the stream the host must run its kernels on: the
// Engine's waits for swapped-in tensors are queued on it.
func (e *Engine) ComputeStream() device.Stream { return e.compute }

// Device is the device the Engine runs on.
func (e *Engine) Device() device.Device { return e.dev }

// NewTensor allocates an Engine-managed tensor of size bytes. Activations
// are allocated by the host right before the op that produces them (listed
// in its Out); persistent tensors at any time.
func (e *Engine) NewTensor(size int64, kind Kind, dtype string, shape []int64) (*Tensor, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, ErrClosed
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
	e.liveB += size
	if kind.persistent() {
		t.produced = true
	}
	return t, nil
}

// slabHandles is how many handles NewTensor allocates at a time.
const slabHandles = 64

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
	e.mu.Lock()
	defer e.mu.Unlock()
	if t.released {
		return nil
	}
	if e.closed {
		return ErrClosed
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
	t.kept = false
	buf := t.host
	t.host = device.HostBuf{}
	return e.pool.PutAfter(buf, t.ready, e.h2d)
}

// free gives a released tensor's memory back.
func (e *Engine) free(t *Tensor) error {
	last := e.live[len(e.live)-1]
	e.live[t.slot], last.slot = last, t.slot
	e.live = e.live[:len(e.live)-1]
	if err := e.unkeep(t); err != nil {
		return err
	}
	switch t.state {
	case resident, swappedIn:
		return e.freeDevice(t)
	case dropped:
		return nil
	default:
		return e.pool.PutAfter(t.host, t.outDone, e.d2h)
	}
}

// freeDevice gives t's device memory back behind the work that may still
// use it: the compute stream's kernels so far, or, for a tensor still
// arriving (swappedIn: compute never waited on it), its copy back.
func (e *Engine) freeDevice(t *Tensor) error {
	if t.state == swappedIn {
		return e.alloc.FreeAfter(t.ptr, t.ready, e.h2d)
	}
	return e.alloc.FreeOn(t.ptr, e.compute)
}
