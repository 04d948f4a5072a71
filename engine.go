package chameleon

import (
	"context"
	"errors"
	"fmt"
	"sync"

	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/internal/controller"
	"github.com/chameleon-go/chameleon/seq"
)

// Engine wires the stages for a training or inference loop: it encodes each
// op (lightweight profile), detects sequence changes, profiles in detail and
// plans when the sequence is stable, and executes the policy: swaps out
// after a tensor's last use before a gap, swaps back ahead of its next use,
// never blocking the host on the hot path.
type Engine struct {
	cfg    config
	dev    device.Device
	enc    *seq.Encoder
	det    Detector
	tracer oteltrace.Tracer
	// mu serializes every call: see the package documentation.
	mu sync.Mutex
	// cb is the goroutine running an Op.Recompute callback, which holds
	// mu: its calls back into the Engine are refused, not deadlocked.
	cb      callbackGuard
	closed  bool
	it      Iteration
	stats   Stats
	onClose []func() error
	// policyErr is why WithPolicyFile's file was not used.
	policyErr error
	rank      rankState // WithRank's exchanges
	tm        *timer    // timing events and what they measured (timing.go)
	// executor is the device side: tensors, pools, streams, the prefetch
	// queue and the layout the allocator follows (executor.go).
	executor
	// inForce is the policy in force, the cache and the controller that
	// chooses between them.
	inForce
	// planWorker runs plans and broadcasts off the step (planner.go).
	planWorker
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
	e := &Engine{cfg: cfg, dev: dev}
	e.ring, e.cache = map[device.Stream]*eventRing{}, newPolicyCache(cfg.detect.MaxMemoryDelta)
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
	if err := e.lock(); err != nil {
		return err
	}
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

// Stage is the stage the next iteration runs in.
func (e *Engine) Stage() seq.Stage {
	defer e.rlock()()
	return e.det.Next()
}

// ComputeStream is the stream the host must run its kernels on: the
// Engine's waits for swapped-in tensors are queued on it.
func (e *Engine) ComputeStream() device.Stream { return e.compute }

// Device is the device the Engine runs on.
func (e *Engine) Device() device.Device { return e.dev }

// slabHandles is how many handles NewTensor allocates at a time.
const slabHandles = 64
