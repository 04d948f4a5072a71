package cuda

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/cuda/driver"
	"github.com/chameleon-go/chameleon/device/devicetest"
)

// The tests in this file need a GPU whose driver (libcuda.so.1 on the
// loader path, or CHAMELEON_LIBCUDA) maps pages; like real_test.go they run
// only when CHAMELEON_CUDART points at libcudart:
//
//	CGO_ENABLED=0 go test -c -o cudatest ./device/cuda
//	CHAMELEON_CUDART=/usr/local/cuda/lib64/libcudart.so.13 ./cudatest -test.run 'Real(Mapper|Spin|Mapped)' -test.v

func newRealMapped(t testing.TB) *Device {
	t.Helper()
	d := newReal(t)
	if d.PageSize() == 0 {
		err := d.Mapping()
		d.Close()
		t.Fatalf("the GPU's driver does not map pages: %v", err)
	}
	return d
}

// TestRealMapperConformance runs the Mapper suite on the GPU: reserve,
// map and unmap 2 MiB pages, bytes through mapped memory read back, the
// misuse refused, and the mapped allocator under fragmentation.
func TestRealMapperConformance(t *testing.T) {
	d := newRealMapped(t)
	t.Logf("%s: page %d bytes, libcuda %s", d.Name(), d.PageSize(), d.vmm.ctx.Driver().Path)
	d.Close()
	devicetest.RunMapper(t, func(t *testing.T) device.Device { return newRealMapped(t) }, devicetest.MapperConfig{NoFaults: true})
}

// TestRealMappedLarge maps 1 GiB behind a reservation, fills it through
// copies and reads it back: every page, not a sample, holds its bytes.
func TestRealMappedLarge(t *testing.T) {
	d := newRealMapped(t)
	defer d.Close()
	const size = 1 << 30
	p, err := d.ReserveAddress(size)
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, d.Map(p, size))
	mapped := time.Since(start)
	chunk := int64(64 << 20)
	h, err := d.AllocHost(chunk)
	require.NoError(t, err)
	defer d.FreeHost(h)
	got := make([]byte, chunk)
	for off := int64(0); off < size; off += chunk {
		b := h.Bytes()
		for i := range b {
			b[i] = byte(off>>20) ^ byte(i*7)
		}
		require.NoError(t, d.CopyH2D(p.Add(off), h, 0))
		require.NoError(t, d.SyncStream(0))
		require.NoError(t, d.ReadDevice(got, p.Add(off)))
		require.Equal(t, b, got, "offset %d", off)
	}
	start = time.Now()
	require.NoError(t, d.Unmap(p, size))
	unmapped := time.Since(start)
	require.NoError(t, d.ReleaseAddress(p))
	pages := size / d.PageSize()
	t.Logf("1 GiB in %d pages: map %v (%.1f µs/page), unmap %v (%.1f µs/page)", pages,
		mapped, float64(mapped.Microseconds())/float64(pages), unmapped, float64(unmapped.Microseconds())/float64(pages))
}

// TestRealSpin times the spin kernel on a stream: it logs, for spins of
// 10 µs to 100 ms, the host's wall time from the launch to the stream's
// completion, and asserts only that it is not shorter than asked.
func TestRealSpin(t *testing.T) {
	d := newRealMapped(t)
	defer d.Close()
	ctx, err := d.Context()
	require.NoError(t, err)
	nv, err := driver.LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC: %v", err)
	}
	sp, err := driver.NewSpinner(ctx, nv, os.Getenv("CHAMELEON_ARCH"))
	require.NoError(t, err)
	defer sp.Close()
	s, err := d.NewStream()
	require.NoError(t, err)
	defer d.DestroyStream(s)
	require.NoError(t, sp.Spin(s, 1000)) // load the module on the GPU
	require.NoError(t, d.SyncStream(s))
	for _, ns := range []int64{10e3, 100e3, 1e6, 10e6, 100e6} {
		best := time.Duration(1 << 62)
		for range 3 {
			start := time.Now()
			require.NoError(t, sp.Spin(s, ns))
			require.NoError(t, d.SyncStream(s))
			best = min(best, time.Since(start))
		}
		t.Logf("spin %v: %v (%+.1f%%)", time.Duration(ns), best, 100*(float64(best)-float64(ns))/float64(ns))
		assert.GreaterOrEqual(t, best, time.Duration(ns), "a spin lasts at least its time")
	}
	// Back to back on one stream the spins add up.
	const n, ns = 100, 100e3
	start := time.Now()
	for range n {
		require.NoError(t, sp.Spin(s, ns))
	}
	issue := time.Since(start)
	require.NoError(t, d.SyncStream(s))
	total := time.Since(start)
	t.Logf("%d spins of %v: %v in all (%v expected), %v per launch on the host", n, time.Duration(ns), total, time.Duration(n*ns), issue/n)
	assert.GreaterOrEqual(t, total, time.Duration(n*ns))
}

// BenchmarkRealSpinLaunch is the host cost of queueing one spin.
func BenchmarkRealSpinLaunch(b *testing.B) {
	d := newRealMapped(b)
	defer d.Close()
	ctx, err := d.Context()
	require.NoError(b, err)
	nv, err := driver.LoadNVRTC()
	if err != nil {
		b.Skipf("no NVRTC: %v", err)
	}
	sp, err := driver.NewSpinner(ctx, nv, os.Getenv("CHAMELEON_ARCH"))
	require.NoError(b, err)
	defer sp.Close()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := sp.Spin(0, 1000); err != nil {
			b.Fatal(err)
		}
		if i++; i%1024 == 0 {
			b.StopTimer()
			require.NoError(b, d.SyncStream(0))
			b.StartTimer()
		}
	}
	b.StopTimer()
	require.NoError(b, d.SyncStream(0))
}

// TestRealMappingGranule times one mapping of a large physical allocation
// against the same bytes as 2 MiB pages: whether the driver's costs go by
// mapping or by page.
func TestRealMappingGranule(t *testing.T) {
	d := newRealMapped(t)
	defer d.Close()
	ctx, err := d.Context()
	require.NoError(t, err)
	page := d.PageSize()
	m := d.vmm
	drv := ctx.Driver()
	for _, chunk := range []int64{page, 8 * page, 32 * page, 256 * page} {
		const total = 512
		n := int(total * page / chunk)
		p, err := d.ReserveAddress(total * page)
		require.NoError(t, err)
		require.NoError(t, ctx.Enter())
		hs := make([]uint64, n)
		t0 := time.Now()
		for i := range hs {
			require.Zero(t, m.v.Create(&m.sc.handle, uintptr(chunk), &m.sc.prop))
			hs[i] = m.sc.handle
		}
		create := time.Since(t0)
		t0 = time.Now()
		for i, h := range hs {
			require.Zero(t, m.v.Map(uintptr(p)+uintptr(int64(i)*chunk), uintptr(chunk), h))
		}
		mp := time.Since(t0)
		t0 = time.Now()
		require.NoError(t, drv.Check("cuMemSetAccess", m.v.SetAccess(uintptr(p), uintptr(total*page), &m.sc.access)))
		access := time.Since(t0)
		t0 = time.Now()
		for i := range hs {
			require.Zero(t, m.v.Unmap(uintptr(p)+uintptr(int64(i)*chunk), uintptr(chunk)))
		}
		unmap := time.Since(t0)
		t0 = time.Now()
		for _, h := range hs {
			require.Zero(t, m.v.Release(h))
		}
		release := time.Since(t0)
		ctx.Leave()
		t.Logf("1 GiB as %d chunks of %d MiB: create %v, map %v, set access %v, unmap %v, release %v; all %v",
			n, chunk>>20, create, mp, access, unmap, release, create+mp+access+unmap+release)
		require.NoError(t, d.ReleaseAddress(p))
	}
}
