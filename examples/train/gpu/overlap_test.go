package gpu_test

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/cuda"
	"github.com/chameleon-go/chameleon/examples/train/gpu"
)

// TestRealCopiesUnderGemm measures what the simulator's link model assumes:
// the rate of 512 MiB copies to and from pinned host memory while the
// training's SGEMMs (65536 x 2048 x 2048, fp32) run on the compute stream.
// It reports; it asserts only that the work completes.
func TestRealCopiesUnderGemm(t *testing.T) {
	path := os.Getenv(cuda.EnvLibrary)
	if path == "" {
		t.Skipf("set %s to libcudart to run on a GPU", cuda.EnvLibrary)
	}
	d, err := cuda.New(cuda.WithLibrary(path))
	require.NoError(t, err)
	defer d.Close()
	k, err := gpu.New(d.DefaultStream())
	require.NoError(t, err)
	defer k.Close()
	compute := d.DefaultStream()
	d2h, err := d.NewStream()
	require.NoError(t, err)
	h2d, err := d.NewStream()
	require.NoError(t, err)

	const m, n, kk = 65536, 2048, 2048
	const chunk = 512 << 20
	const copies = 16
	a, err := d.Alloc(m * kk * 4)
	require.NoError(t, err)
	b, err := d.Alloc(kk * n * 4)
	require.NoError(t, err)
	c, err := d.Alloc(m * n * 4)
	require.NoError(t, err)
	src, err := d.Alloc(copies * chunk)
	require.NoError(t, err)
	dst, err := d.Alloc(copies * chunk)
	require.NoError(t, err)
	hostOut, err := d.AllocHost(copies * chunk)
	require.NoError(t, err)
	hostIn, err := d.AllocHost(copies * chunk)
	require.NoError(t, err)

	gemms := func(count int) {
		for range count {
			require.NoError(t, k.Gemm(false, false, m, n, kk, 1, a, b, 0, c))
		}
	}
	out := func() {
		for i := range copies {
			require.NoError(t, d.CopyD2H(hostOut.Slice(int64(i)*chunk, chunk), src.Add(int64(i)*chunk), d2h))
		}
	}
	in := func() {
		for i := range copies {
			require.NoError(t, d.CopyH2D(dst.Add(int64(i)*chunk), hostIn.Slice(int64(i)*chunk, chunk), h2d))
		}
	}
	wait := func(ss ...device.Stream) time.Duration {
		t0 := time.Now()
		for _, s := range ss {
			require.NoError(t, d.SyncStream(s))
		}
		return time.Since(t0)
	}
	gb := float64(copies*chunk) / 1e9
	timed := func(f func()) time.Duration { t0 := time.Now(); f(); return time.Since(t0) }

	gemms(2)
	wait(compute)
	tGemm := timed(func() { gemms(20); wait(compute) })
	tOut := timed(func() { out(); wait(d2h) })
	tIn := timed(func() { in(); wait(h2d) })
	tBoth := timed(func() { out(); in(); wait(d2h, h2d) })
	t.Logf("alone: 20 SGEMMs %v (%.1f TFLOP/s); D2H %.1f GB/s; H2D %.1f GB/s; both directions %.1f GB/s each",
		tGemm, 20*2*float64(m)*n*kk/tGemm.Seconds()/1e12, gb/tOut.Seconds(), gb/tIn.Seconds(), gb/tBoth.Seconds())

	t0 := time.Now()
	gemms(20)
	out()
	wait(d2h)
	tO := time.Since(t0)
	wait(compute)
	tG := time.Since(t0)
	t.Logf("under SGEMMs: D2H %.1f GB/s (copies done at %v, SGEMMs at %v)", gb/tO.Seconds(), tO, tG)

	t0 = time.Now()
	gemms(20)
	out()
	in()
	wait(d2h, h2d)
	tO = time.Since(t0)
	wait(compute)
	tG = time.Since(t0)
	t.Logf("under SGEMMs: both directions %.1f GB/s each (copies done at %v, SGEMMs at %v)", gb/tO.Seconds(), tO, tG)
}
