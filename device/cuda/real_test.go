package cuda

import (
	"bytes"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/devicetest"
)

// Tests and benchmarks in this file need a GPU. They run only when
// CHAMELEON_CUDART points at libcudart, e.g.
//
//	CGO_ENABLED=0 go test -c -o cudatest ./device/cuda
//	CHAMELEON_CUDART=/usr/local/cuda/lib64/libcudart.so.13 ./cudatest -test.run Real -test.v -test.bench Real

func newReal(t testing.TB) *Device {
	t.Helper()
	path := os.Getenv(EnvLibrary)
	if path == "" {
		t.Skipf("set %s to libcudart to run on a GPU", EnvLibrary)
	}
	d, err := New(WithLibrary(path))
	require.NoError(t, err)
	return d
}

func TestRealConformance(t *testing.T) {
	newReal(t).Close()
	devicetest.Run(t, func(t *testing.T) device.Device { return newReal(t) })
}

const (
	chunk  = 64 << 20 // bytes per copy
	chunks = 16       // copies per direction and round
	rounds = 3        // best of
)

// swapRig holds what both measured paths need: device memory the size of
// all chunks, pinned host memory of the same size, a copy stream and events.
type swapRig struct {
	d      *Device
	s      device.Stream
	evs    []device.Event
	data   []byte // reference bytes, chunks*chunk
	rawDev device.DevPtr
	rawHst device.HostBuf
	alloc  *device.Allocator
	pool   *device.HostPool
}

func newRig(t testing.TB) *swapRig {
	d := newReal(t)
	t.Cleanup(func() { d.Close() })
	r := &swapRig{d: d}
	var err error
	r.s, err = d.NewStream()
	require.NoError(t, err)
	for range chunks {
		ev, err := d.NewEvent()
		require.NoError(t, err)
		r.evs = append(r.evs, ev)
	}
	r.data = make([]byte, chunks*chunk)
	for i := range r.data {
		r.data[i] = byte(i*131 + i>>20)
	}
	r.rawDev, err = d.Alloc(chunks * chunk)
	require.NoError(t, err)
	t.Cleanup(func() { d.Free(r.rawDev) })
	r.rawHst, err = d.AllocHost(chunks * chunk)
	require.NoError(t, err)
	t.Cleanup(func() { d.FreeHost(r.rawHst) })

	r.alloc = device.NewAllocator(d)
	require.NoError(t, r.alloc.Reserve(2*chunks*chunk))
	t.Cleanup(func() { r.alloc.Close() })
	r.pool = device.NewHostPool(d)
	require.NoError(t, r.pool.Reserve(chunks*chunk))
	t.Cleanup(func() { r.pool.Close() })
	return r
}

// raw copies every chunk with plain cudaMemcpyAsync on one stream and returns
// the wall time from first issue to stream completion.
func (r *swapRig) raw(t testing.TB, h2d bool) time.Duration {
	start := time.Now()
	for i := range chunks {
		dev := r.rawDev.Add(int64(i) * chunk)
		hst := r.rawHst.Slice(int64(i)*chunk, chunk)
		var err error
		if h2d {
			err = r.d.CopyH2D(dev, hst, r.s)
		} else {
			err = r.d.CopyD2H(hst, dev, r.s)
		}
		require.NoError(t, err)
	}
	require.NoError(t, r.d.SyncStream(r.s))
	return time.Since(start)
}

// swapOut moves every block to pinned buffers from the pool and frees the
// blocks behind the copies; swapIn brings them back into fresh blocks. Both
// are the engine's path: allocator, pool, async copy, event, free-after.
func (r *swapRig) swapOut(t testing.TB, blocks []device.DevPtr) ([]device.HostBuf, time.Duration) {
	bufs := make([]device.HostBuf, len(blocks))
	start := time.Now()
	for i, p := range blocks {
		hb, err := r.pool.Get(chunk, r.s)
		require.NoError(t, err)
		require.NoError(t, r.d.CopyD2H(hb, p, r.s))
		require.NoError(t, r.d.Record(r.evs[i], r.s))
		require.NoError(t, r.alloc.FreeAfter(p, r.evs[i], r.s))
		bufs[i] = hb
	}
	require.NoError(t, r.d.SyncStream(r.s))
	return bufs, time.Since(start)
}

func (r *swapRig) swapIn(t testing.TB, bufs []device.HostBuf) ([]device.DevPtr, time.Duration) {
	blocks := make([]device.DevPtr, len(bufs))
	start := time.Now()
	for i, hb := range bufs {
		p, err := r.alloc.Alloc(chunk, r.s)
		require.NoError(t, err)
		require.NoError(t, r.d.CopyH2D(p, hb, r.s))
		require.NoError(t, r.d.Record(r.evs[i], r.s))
		require.NoError(t, r.pool.PutAfter(hb, r.evs[i], r.s))
		blocks[i] = p
	}
	require.NoError(t, r.d.SyncStream(r.s))
	return blocks, time.Since(start)
}

func gbps(d time.Duration) float64 { return float64(chunks*chunk) / d.Seconds() / 1e9 }

// TestRealSwapBandwidth compares the allocator + pool path with plain pinned
// copies, checks that the bytes survive a round trip, and measures the host
// cost of issuing one swap operation. Targets: at least 95% of raw bandwidth
// each way and at most 5 us of host time per swap operation.
func TestRealSwapBandwidth(t *testing.T) {
	r := newRig(t)
	d := r.d
	t.Logf("device %s, %d x %d MiB per direction", d.Name(), chunks, chunk>>20)

	copy(r.rawHst.Bytes(), r.data)
	var rawH2D, rawD2H time.Duration = 1 << 62, 1 << 62
	for range rounds + 1 { // first round warms up
		rawH2D = min(rawH2D, r.raw(t, true))
		rawD2H = min(rawD2H, r.raw(t, false))
	}
	got := make([]byte, chunks*chunk)
	require.NoError(t, d.ReadDevice(got, r.rawDev))
	require.True(t, bytes.Equal(r.data, got), "raw H2D bytes differ")
	require.True(t, bytes.Equal(r.data, r.rawHst.Bytes()), "raw D2H bytes differ")

	blocks := make([]device.DevPtr, chunks)
	for i := range blocks {
		p, err := r.alloc.Alloc(chunk, r.s)
		require.NoError(t, err)
		require.NoError(t, d.WriteDevice(p, r.data[i*chunk:(i+1)*chunk]))
		blocks[i] = p
	}
	var out, in time.Duration = 1 << 62, 1 << 62
	for range rounds + 1 {
		bufs, o := r.swapOut(t, blocks)
		for i, hb := range bufs {
			require.True(t, bytes.Equal(r.data[i*chunk:(i+1)*chunk], hb.Bytes()), "swapped-out chunk %d differs", i)
		}
		blocks, in = r.swapIn(t, bufs)
		out = min(out, o)
		_ = in
	}
	// Time swap-in on its own best of rounds too.
	for range rounds {
		bufs, _ := r.swapOut(t, blocks)
		var i2 time.Duration
		blocks, i2 = r.swapIn(t, bufs)
		in = min(in, i2)
	}
	for i, p := range blocks {
		require.NoError(t, d.ReadDevice(got[:chunk], p))
		require.True(t, bytes.Equal(r.data[i*chunk:(i+1)*chunk], got[:chunk]), "swapped-in chunk %d differs", i)
	}

	ratioIn := gbps(in) / gbps(rawH2D)
	ratioOut := gbps(out) / gbps(rawD2H)
	t.Logf("H2D raw %.1f GB/s, swap-in %.1f GB/s, ratio %.3f", gbps(rawH2D), gbps(in), ratioIn)
	t.Logf("D2H raw %.1f GB/s, swap-out %.1f GB/s, ratio %.3f", gbps(rawD2H), gbps(out), ratioOut)
	if ratioIn < 0.95 || ratioOut < 0.95 {
		t.Errorf("swap path below 95%% of raw bandwidth: in %.3f, out %.3f", ratioIn, ratioOut)
	}

	ns := hostCostPerOp(t, d, false)
	t.Logf("host cost per swap op (alloc + copy + record + free-after): %.0f ns", ns)
	if ns > 5000 {
		t.Errorf("host cost %.0f ns per swap op, target 5000", ns)
	}
	t.Logf("host cost per swap op reusing memory from another stream (adds a stream wait): %.0f ns",
		hostCostPerOp(t, d, true))
	st := r.alloc.Stats()
	t.Logf("allocator: reserved %d MiB, peak %d MiB, backend allocs %d, fragmentation %.3f",
		st.Reserved>>20, st.PeakAllocated>>20, st.BackendAllocs, st.Fragmentation)
	require.EqualValues(t, 1, st.BackendAllocs, "the hot path never calls cudaMalloc")
}

// hostCostPerOp times only the issuing of swap operations (no syncs inside
// the timed batches) with small copies, so that the GPU never falls behind
// far enough to block the launch queue. With cross, memory is allocated for
// a second stream, so every reuse also queues a cudaStreamWaitEvent.
func hostCostPerOp(t testing.TB, d *Device, cross bool) float64 {
	const (
		size  = 64 << 10
		batch = 256
		iters = 40
	)
	a := device.NewAllocator(d)
	defer a.Close()
	require.NoError(t, a.Reserve(4*batch*size))
	pool := device.NewHostPool(d)
	defer pool.Close()
	require.NoError(t, pool.Reserve(size))
	hb, err := pool.Get(size, 0)
	require.NoError(t, err)
	s, err := d.NewStream()
	require.NoError(t, err)
	defer d.DestroyStream(s)
	allocOn := s
	if cross {
		allocOn, err = d.NewStream()
		require.NoError(t, err)
		defer d.DestroyStream(allocOn)
	}
	evs := make([]device.Event, batch)
	for i := range evs {
		evs[i], err = d.NewEvent()
		require.NoError(t, err)
	}
	var total time.Duration
	for it := range iters {
		start := time.Now()
		for i := range batch {
			p, err := a.Alloc(size, allocOn)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.CopyD2H(hb, p, s); err != nil {
				t.Fatal(err)
			}
			if err := d.Record(evs[i], s); err != nil {
				t.Fatal(err)
			}
			if err := a.FreeAfter(p, evs[i], s); err != nil {
				t.Fatal(err)
			}
		}
		if it > 0 { // the first batch warms up
			total += time.Since(start)
		}
		require.NoError(t, d.SyncStream(s))
	}
	return float64(total.Nanoseconds()) / float64((iters-1)*batch)
}

// BenchmarkRealCopyRaw reports plain pinned-copy bandwidth each way.
func BenchmarkRealCopyRaw(b *testing.B) {
	r := newRig(b)
	var h2d, d2h time.Duration
	for b.Loop() {
		h2d += r.raw(b, true)
		d2h += r.raw(b, false)
	}
	n := float64(b.N)
	b.ReportMetric(float64(chunks*chunk)*n/h2d.Seconds()/1e9, "H2D-GB/s")
	b.ReportMetric(float64(chunks*chunk)*n/d2h.Seconds()/1e9, "D2H-GB/s")
}

// BenchmarkRealCopySwap reports the allocator + pool path's bandwidth.
func BenchmarkRealCopySwap(b *testing.B) {
	r := newRig(b)
	blocks := make([]device.DevPtr, chunks)
	for i := range blocks {
		p, err := r.alloc.Alloc(chunk, r.s)
		require.NoError(b, err)
		blocks[i] = p
	}
	var out, in time.Duration
	for b.Loop() {
		bufs, o := r.swapOut(b, blocks)
		var i time.Duration
		blocks, i = r.swapIn(b, bufs)
		out += o
		in += i
	}
	n := float64(b.N)
	b.ReportMetric(float64(chunks*chunk)*n/in.Seconds()/1e9, "H2D-GB/s")
	b.ReportMetric(float64(chunks*chunk)*n/out.Seconds()/1e9, "D2H-GB/s")
}

// BenchmarkRealSwapOp reports the host cost of issuing one swap operation.
func BenchmarkRealSwapOp(b *testing.B) {
	d := newReal(b)
	defer d.Close()
	benchSwapOp(b, d, 64<<10, false)
}

// BenchmarkRealSwapOpMapped is BenchmarkRealSwapOp on mapped pages, as
// the Engine allocates on a GPU whose driver maps (target: at or under 5 µs).
func BenchmarkRealSwapOpMapped(b *testing.B) {
	d := newReal(b)
	defer d.Close()
	if d.PageSize() == 0 {
		b.Skipf("no page mapping: %v", d.Mapping())
	}
	benchSwapOp(b, d, 64<<10, true)
}
