package main

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"unsafe"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/cuda"
	"github.com/chameleon-go/chameleon/device/cuda/nccl"
	"github.com/chameleon-go/chameleon/device/host"
)

// Data-parallel ranks: one Engine per device, each training on its shard
// of the global batch (Config.Rank), the gradients averaged over the
// ranks before the optimizer step (Reducer), the policy planned by rank
// 0 and adopted by the others (chameleon.WithRank).

// Reducer averages a float32 buffer over the data-parallel ranks. Every
// rank calls AllReduce for the same buffers in the same order, from the
// goroutine that drives its device, inside the op that lists the buffer's
// tensor (its address is the one it has during the op). Once the work it
// queued on the compute stream is done, x holds the mean of every rank's
// x, the same bits on every rank. The host backend's reduces in Go before
// it returns; NCCL's is queued on the compute stream.
type Reducer interface {
	AllReduce(x device.DevPtr, n int) error
}

// errAborted is what a rank gets when another rank failed.
var errAborted = errors.New("another rank failed")

// barrier is a reusable barrier of n goroutines that abort releases.
type barrier struct {
	mu    sync.Mutex
	n, in int
	gen   chan struct{}
	abort chan struct{}
	once  sync.Once
}

func newBarrier(n int) *barrier {
	return &barrier{n: n, gen: make(chan struct{}), abort: make(chan struct{})}
}

// wait returns once all n have called it, or errAborted.
func (b *barrier) wait() error {
	b.mu.Lock()
	select {
	case <-b.abort:
		b.mu.Unlock()
		return errAborted
	default:
	}
	gen := b.gen
	if b.in++; b.in == b.n {
		b.in, b.gen = 0, make(chan struct{})
		close(gen)
		b.mu.Unlock()
		return nil
	}
	b.mu.Unlock()
	select {
	case <-gen:
		return nil
	case <-b.abort:
		return errAborted
	}
}

func (b *barrier) stop() { b.once.Do(func() { close(b.abort) }) }

// hostGroup is the all-reduce of the host backend's ranks, one device
// each, in Go: each rank hands its buffer in, then each rank averages a
// range of the elements over every rank's buffer and writes the mean into
// all of them. An element is summed in rank order and divided by the rank
// count, whichever rank does it, so every rank gets the same bits, run
// after run.
type hostGroup struct {
	n    int
	bufs [][]float32
	bar  *barrier
}

func newHostGroup(n int) *hostGroup {
	return &hostGroup{n: n, bufs: make([][]float32, n), bar: newBarrier(n)}
}

// abort releases every rank waiting in an all-reduce, and fails the later
// ones.
func (g *hostGroup) abort() { g.bar.stop() }

func (g *hostGroup) reduce(rank int, x []float32) error {
	if g.n == 1 {
		return nil // the mean of one
	}
	g.bufs[rank] = x
	if err := g.bar.wait(); err != nil {
		return err
	}
	var err error
	for s, b := range g.bufs {
		if len(b) != len(x) {
			err = fmt.Errorf("all-reduce: rank %d has %d elements, rank %d %d: the ranks are out of step", rank, len(x), s, len(b))
		}
	}
	if err == nil {
		lo, hi := rank*len(x)/g.n, (rank+1)*len(x)/g.n
		inv := float32(g.n)
		for i := lo; i < hi; i++ {
			var sum float32
			for _, b := range g.bufs {
				sum += b[i]
			}
			m := sum / inv
			for _, b := range g.bufs {
				b[i] = m
			}
		}
	}
	// Every range written before any rank reads its buffer again.
	if werr := g.bar.wait(); werr != nil && err == nil {
		err = werr
	}
	if err != nil {
		g.abort()
	}
	return err
}

// hostReducer is rank rank's end of a hostGroup on a host device.
type hostReducer struct {
	g    *hostGroup
	rank int
	d    *host.Device
	s    device.Stream
}

// reducer makes rank's Reducer on d for Config.Reduce.
func (g *hostGroup) reducer(rank int, d *host.Device) func(device.Stream) (Reducer, error) {
	return func(s device.Stream) (Reducer, error) { return &hostReducer{g: g, rank: rank, d: d, s: s}, nil }
}

// AllReduce implements Reducer: it waits for the compute stream (the
// kernels that wrote x), then reduces with the other ranks before it
// returns.
func (h *hostReducer) AllReduce(x device.DevPtr, n int) error {
	if err := h.d.SyncStream(h.s); err != nil {
		return err
	}
	b := h.d.Bytes(x, int64(n)*4)
	if b == nil {
		return fmt.Errorf("all-reduce: %d floats at %#x are not device memory: %w", n, uintptr(x), device.ErrInvalidValue)
	}
	return h.g.reduce(h.rank, unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), n))
}

// ncclReducer is one rank's gradient all-reduce over NCCL: an
// ncclAllReduce (average) in place on the compute stream, on a
// communicator that serves the gradients alone (not the policy channel's:
// that one broadcasts at moments of the Engine's choosing). Each rank's
// goroutine issues its own communicator's calls, so no group is needed.
type ncclReducer struct {
	comm *nccl.Comm
	s    device.Stream
}

// AllReduce implements Reducer.
func (r *ncclReducer) AllReduce(x device.DevPtr, n int) error {
	return r.comm.AllReduce(x, x, int64(n), nccl.Float32, nccl.Avg, r.s)
}

// holdDevice makes dev's GPU current on the calling goroutine's OS
// thread, which the caller holds (runtime.LockOSThread), until leave; for
// a device other than CUDA it does nothing. The CUDA runtime keeps the
// current GPU per thread, and device/cuda sets it on each call for a GPU
// other than 0 only, leaving GPU 0's calls to whatever the thread has
// current: a thread that ran GPU 1's calls before would send them to GPU 1.
// Its primary context pushed for the thread's remaining life, GPU 0's
// calls from the thread reach GPU 0 (the runtime takes the context current
// on the thread as its device).
func holdDevice(dev device.Device) (leave func(), err error) {
	d, ok := dev.(*cuda.Device)
	if !ok {
		return func() {}, nil
	}
	ctx, err := d.Context()
	if err != nil {
		return func() {}, nil // no libcuda: the runtime's own rule it is
	}
	if err := ctx.Enter(); err != nil {
		return nil, fmt.Errorf("%s: %w", d.Name(), err)
	}
	return ctx.Leave, nil
}

// onDevice runs fn on a goroutine locked to an OS thread that ends with
// it (onThread), with dev's GPU current there (holdDevice).
func onDevice(dev device.Device, fn func() error) (err error) {
	onThread(func() {
		leave, herr := holdDevice(dev)
		if herr != nil {
			err = herr
			return
		}
		defer leave()
		err = fn()
	})
	return err
}

// oneRank is the all-reduce of a single rank: the mean of one buffer is
// itself.
type oneRank struct{}

// AllReduce implements Reducer.
func (oneRank) AllReduce(device.DevPtr, int) error { return nil }

// Rank is one data-parallel rank's device for TrainRanks.
type Rank struct {
	Dev     device.Device
	Kernels Kernels
	// Reduce makes the rank's Reducer (Config.Reduce).
	Reduce func(compute device.Stream) (Reducer, error)
	// Options are the rank's own Engine options, after Config.Options:
	// chameleon.WithRank with its end of the policy channel, and the like.
	Options []chameleon.Option
}

// TrainRanks runs cfg on every rank at once, one goroutine per rank, each
// locked to an OS thread of its own: cfg.Model.Batch is the batch of one
// rank, rank r training on rows [r*Batch, (r+1)*Batch) of the global
// batch. Only rank 0 reports progress. When a rank fails, abort (nil:
// none) is called once, to release the ranks waiting for it; the error
// names every rank that failed, those that were only released left out.
func TrainRanks(ranks []Rank, cfg Config, abort func()) ([]*Report, error) {
	reps := make([]*Report, len(ranks))
	errs := make([]error, len(ranks))
	var once sync.Once
	var wg sync.WaitGroup
	for r := range ranks {
		wg.Go(func() {
			// The thread is never unlocked, so that it ends with the
			// goroutine: on CUDA it keeps rank r's GPU current, which
			// no other goroutine should inherit.
			runtime.LockOSThread()
			leave, err := holdDevice(ranks[r].Dev)
			if err != nil {
				errs[r] = err
				if abort != nil {
					once.Do(abort)
				}
				return
			}
			defer leave()
			c := cfg
			c.Rank, c.Reduce = r, ranks[r].Reduce
			c.Options = append(append([]chameleon.Option(nil), cfg.Options...), ranks[r].Options...)
			if r != 0 {
				c.Progress = nil
			}
			reps[r], errs[r] = Train(ranks[r].Dev, ranks[r].Kernels, c)
			if errs[r] != nil && abort != nil {
				once.Do(abort)
			}
		})
	}
	wg.Wait()
	var failed, released []error
	for r, err := range errs {
		switch {
		case err == nil:
		case errors.Is(err, errAborted) || errors.Is(err, chameleon.ErrChannelClosed) || errors.Is(err, nccl.ErrClosed):
			released = append(released, fmt.Errorf("rank %d: %w", r, err))
		default:
			failed = append(failed, fmt.Errorf("rank %d: %w", r, err))
		}
	}
	if len(failed) > 0 {
		return reps, errors.Join(failed...)
	}
	return reps, errors.Join(released...)
}

// RankTolerance is how far apart, relatively, the losses of N ranks may
// be from those of one device at the same global batch. The arithmetic is
// the same but for the order of fp32 sums: each rank sums its own rows
// (the loss, the weight gradients' reductions over the batch, the bias
// gradients) and the ranks' means are then averaged, where one device sums
// all the rows at once. The loss alone is a running fp32 sum of batch*out
// terms, whose rounding is around sqrt(n)*2^-24 relative: 1e-5 at a batch
// of 1536 and 16 outputs, so 1e-5 would be at the noise. On the host
// backend the differences stay between 1e-7 and 1.2e-5 over 100 steps at
// 2, 3 and 4 ranks (they do not grow: the training contracts them); a
// wrong shard, the ranks drawing the same rows, gives 5e-2 from the first
// steps. Every rank's losses must in any case be bitwise the same.
const RankTolerance = 1e-4

// relDiff is the largest |a-b|/|b| over the steps both have (+Inf when
// their lengths differ or a loss is not finite).
func relDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	var m float64
	for i := range a {
		x, y := float64(a[i]), float64(b[i])
		if math.IsNaN(x) || math.IsNaN(y) || math.IsInf(x, 0) || math.IsInf(y, 0) {
			return math.Inf(1)
		}
		d := math.Abs(x - y)
		if y != 0 {
			d /= math.Abs(y)
		}
		m = max(m, d)
	}
	return m
}

// firstDiff is the first step whose losses differ in any bit (-1: none;
// len of the shorter when only the lengths differ).
func firstDiff(a, b []float32) int {
	for i := range min(len(a), len(b)) {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}
