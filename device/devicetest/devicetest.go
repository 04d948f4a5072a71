// Package devicetest is the conformance suite every device.Device backend
// passes: memory, copies in both directions with offsets, FIFO order per
// stream, CUDA event semantics, timing events, cross-stream waits, memory
// info, and the Allocator and HostPool swap path on top of the backend.
//
// Ordering checks only bite on backends whose copies take time; the host
// backend runs the suite with its link model on for that reason.
package devicetest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
)

// Run runs the suite. newDev returns a fresh device for each subtest; Run
// closes it when the subtest ends.
func Run(t *testing.T, newDev func(t *testing.T) device.Device) {
	tests := []struct {
		name string
		fn   func(t *testing.T, d device.Device)
	}{
		{"AllocFree", testAllocFree},
		{"OutOfMemory", testOutOfMemory},
		{"MemInfo", testMemInfo},
		{"RoundTrip", testRoundTrip},
		{"Offsets", testOffsets},
		{"FIFO", testFIFO},
		{"Events", testEvents},
		{"StreamWait", testStreamWait},
		{"Timing", testTiming},
		{"AllocatorSwap", testAllocatorSwap},
		{"HostPool", testHostPool},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newDev(t)
			t.Cleanup(func() { assert.NoError(t, d.Close()) })
			tt.fn(t, d)
		})
	}
}

// pattern returns n reproducible pseudo-random bytes.
func pattern(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, (n+7)/8*8)
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b[:n:n]
}

func hostBuf(t *testing.T, d device.Device, data []byte) device.HostBuf {
	t.Helper()
	h, err := d.AllocHost(int64(len(data)))
	require.NoError(t, err)
	copy(h.Bytes(), data)
	t.Cleanup(func() { assert.NoError(t, d.FreeHost(h)) })
	return h
}

func devBuf(t *testing.T, d device.Device, n int64) device.DevPtr {
	t.Helper()
	p, err := d.Alloc(n)
	require.NoError(t, err)
	require.NotZero(t, p)
	t.Cleanup(func() { assert.NoError(t, d.Free(p)) })
	return p
}

func newStream(t *testing.T, d device.Device) device.Stream {
	t.Helper()
	s, err := d.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, d.DestroyStream(s)) })
	return s
}

func newEvent(t *testing.T, d device.Device) device.Event {
	t.Helper()
	e, err := d.NewEvent()
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, d.DestroyEvent(e)) })
	return e
}

// equal compares without dumping megabytes on failure.
func equal(t *testing.T, want, got []byte, msg string) {
	t.Helper()
	if !bytes.Equal(want, got) {
		i := 0
		for i < min(len(want), len(got)) && want[i] == got[i] {
			i++
		}
		t.Errorf("%s: bytes differ (len %d vs %d), first difference at %d", msg, len(want), len(got), i)
	}
}

func testAllocFree(t *testing.T, d device.Device) {
	require.NotEmpty(t, d.Name())
	a, err := d.Alloc(1 << 20)
	require.NoError(t, err)
	b, err := d.Alloc(1 << 20)
	require.NoError(t, err)
	assert.NotEqual(t, a, b)
	assert.True(t, b >= a+1<<20 || a >= b+1<<20, "allocations overlap: %#x %#x", a, b)
	require.NoError(t, d.Free(a))
	require.NoError(t, d.Free(b))

	_, err = d.Alloc(0)
	assert.ErrorIs(t, err, device.ErrInvalidValue)
	_, err = d.Alloc(-1)
	assert.ErrorIs(t, err, device.ErrInvalidValue)
	_, err = d.AllocHost(0)
	assert.ErrorIs(t, err, device.ErrInvalidValue)
}

func testOutOfMemory(t *testing.T, d device.Device) {
	_, total, err := d.MemInfo()
	require.NoError(t, err)
	_, err = d.Alloc(2 * total)
	require.Error(t, err)
	assert.ErrorIs(t, err, device.ErrOutOfMemory)
	assert.False(t, errors.Is(err, device.ErrInvalidValue), "OOM must not read as invalid value: %v", err)
	// The device stays usable after a failed allocation.
	p := devBuf(t, d, 4096)
	want := pattern(1, 4096)
	require.NoError(t, d.WriteDevice(p, want))
	got := make([]byte, 4096)
	require.NoError(t, d.ReadDevice(got, p))
	equal(t, want, got, "after OOM")
}

func testMemInfo(t *testing.T, d device.Device) {
	free, total, err := d.MemInfo()
	require.NoError(t, err)
	require.Positive(t, total)
	require.GreaterOrEqual(t, free, int64(0))
	require.LessOrEqual(t, free, total)
	const n = 64 << 20
	if free < 2*n {
		t.Skipf("only %d bytes free", free)
	}
	devBuf(t, d, n)
	after, total2, err := d.MemInfo()
	require.NoError(t, err)
	assert.Equal(t, total, total2)
	assert.LessOrEqual(t, after, free-n, "free memory must drop by the allocation")
}

func testRoundTrip(t *testing.T, d device.Device) {
	sizes := []int{1, 4093, 1 << 20, 4 << 20}
	s := newStream(t, d)
	for i, n := range sizes {
		want := pattern(uint64(i+10), n)
		src := hostBuf(t, d, want)
		dst := hostBuf(t, d, make([]byte, n))
		a := devBuf(t, d, int64(n))
		b := devBuf(t, d, int64(n))
		require.NoError(t, d.CopyH2D(a, src, s))
		require.NoError(t, d.CopyD2D(b, a, int64(n), s))
		require.NoError(t, d.CopyD2H(dst, b, s))
		require.NoError(t, d.SyncStream(s))
		equal(t, want, dst.Bytes(), "H2D, D2D, D2H")

		got := make([]byte, n)
		require.NoError(t, d.ReadDevice(got, a))
		equal(t, want, got, "ReadDevice")
		want2 := pattern(uint64(i+100), n)
		require.NoError(t, d.WriteDevice(b, want2))
		require.NoError(t, d.CopyD2H(dst, b, d.DefaultStream()))
		require.NoError(t, d.SyncStream(d.DefaultStream()))
		equal(t, want2, dst.Bytes(), "WriteDevice then D2H on the default stream")
	}
}

func testOffsets(t *testing.T, d device.Device) {
	const n = 1 << 16
	s := newStream(t, d)
	p := devBuf(t, d, n)
	zero := make([]byte, n)
	require.NoError(t, d.WriteDevice(p, zero))
	data := pattern(7, n)
	src := hostBuf(t, d, data)
	// Copy the middle of the host buffer to an offset on the device.
	require.NoError(t, d.CopyH2D(p.Add(1000), src.Slice(500, 3000), s))
	require.NoError(t, d.CopyD2D(p.Add(20000), p.Add(1000), 3000, s))
	out := hostBuf(t, d, make([]byte, 3000))
	require.NoError(t, d.CopyD2H(out, p.Add(20000), s))
	require.NoError(t, d.SyncStream(s))
	equal(t, data[500:3500], out.Bytes(), "offset copy")
	got := make([]byte, n)
	require.NoError(t, d.ReadDevice(got, p))
	want := make([]byte, n)
	copy(want[1000:], data[500:3500])
	copy(want[20000:], data[500:3500])
	equal(t, want, got, "bytes outside the copied ranges stay untouched")
}

func testFIFO(t *testing.T, d device.Device) {
	const n = 1 << 20
	s := newStream(t, d)
	p := devBuf(t, d, n)
	q := devBuf(t, d, n)
	bufs := make([]device.HostBuf, 4)
	for i := range bufs {
		bufs[i] = hostBuf(t, d, pattern(uint64(200+i), n))
	}
	out := hostBuf(t, d, make([]byte, n))
	// Each write overwrites the previous one; only FIFO order leaves the last.
	for round := range 3 {
		for _, b := range bufs {
			require.NoError(t, d.CopyH2D(p, b, s))
		}
		require.NoError(t, d.CopyD2D(q, p, n, s))
		require.NoError(t, d.CopyH2D(p, bufs[round], s))
		require.NoError(t, d.CopyD2H(out, q, s))
		require.NoError(t, d.SyncStream(s))
		equal(t, bufs[len(bufs)-1].Bytes(), out.Bytes(), "last write before D2D wins")
		got := make([]byte, n)
		require.NoError(t, d.ReadDevice(got, p))
		equal(t, bufs[round].Bytes(), got, "later write lands after the D2D")
	}
}

func testEvents(t *testing.T, d device.Device) {
	ev := newEvent(t, d)
	done, err := d.Query(ev)
	require.NoError(t, err)
	assert.True(t, done, "a never-recorded event is complete")
	require.NoError(t, d.SyncEvent(ev), "sync on a never-recorded event returns")

	const n = 4 << 20
	s := newStream(t, d)
	p := devBuf(t, d, n)
	want := pattern(3, n)
	src := hostBuf(t, d, want)
	out := hostBuf(t, d, make([]byte, n))
	require.NoError(t, d.CopyH2D(p, src, s))
	require.NoError(t, d.CopyD2H(out, p, s))
	require.NoError(t, d.Record(ev, s))
	require.NoError(t, d.SyncEvent(ev))
	done, err = d.Query(ev)
	require.NoError(t, err)
	assert.True(t, done)
	equal(t, want, out.Bytes(), "work before the event completed")

	// Re-recording on an idle stream completes too.
	require.NoError(t, d.Record(ev, d.DefaultStream()))
	require.NoError(t, d.SyncStream(d.DefaultStream()))
	done, err = d.Query(ev)
	require.NoError(t, err)
	assert.True(t, done)

	_, err = d.NewEvent()
	require.NoError(t, err) // left for Close to reclaim
}

func testStreamWait(t *testing.T, d device.Device) {
	const n = 4 << 20
	s1 := newStream(t, d)
	s2 := newStream(t, d)
	ev := newEvent(t, d)
	a := devBuf(t, d, n)
	b := devBuf(t, d, n)
	for i := range 3 {
		want := pattern(uint64(300+i), n)
		src := hostBuf(t, d, want)
		out := hostBuf(t, d, make([]byte, n))
		require.NoError(t, d.CopyH2D(a, src, s1))
		require.NoError(t, d.Record(ev, s1))
		require.NoError(t, d.StreamWait(s2, ev))
		require.NoError(t, d.CopyD2D(b, a, n, s2))
		require.NoError(t, d.CopyD2H(out, b, s2))
		require.NoError(t, d.SyncStream(s2))
		equal(t, want, out.Bytes(), "s2 saw s1's copy through the event")
	}
}

// testTiming checks the timing events' contract: Elapsed between two
// records on one stream and across streams, the sign, and the refusals (an
// event never recorded, one made without timing).
func testTiming(t *testing.T, d device.Device) {
	newTiming := func() device.Event {
		e, err := d.NewTimingEvent()
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, d.DestroyEvent(e)) })
		return e
	}
	start, end, other := newTiming(), newTiming(), newTiming()
	_, err := d.Elapsed(start, end)
	assert.ErrorIs(t, err, device.ErrInvalidValue, "never recorded")

	const n = 4 << 20
	s1, s2 := newStream(t, d), newStream(t, d)
	p := devBuf(t, d, n)
	want := pattern(7, n)
	src := hostBuf(t, d, want)
	out := hostBuf(t, d, make([]byte, n))
	require.NoError(t, d.Record(start, s1))
	require.NoError(t, d.CopyH2D(p, src, s1))
	require.NoError(t, d.Record(end, s1))
	require.NoError(t, d.StreamWait(s2, end))
	require.NoError(t, d.CopyD2H(out, p, s2))
	require.NoError(t, d.Record(other, s2))
	require.NoError(t, d.SyncEvent(other))
	equal(t, want, out.Bytes(), "timing events order work as events do")

	el, err := d.Elapsed(start, end)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, el, time.Duration(0), "a copy takes no negative time")
	back, err := d.Elapsed(end, start)
	require.NoError(t, err)
	assert.Equal(t, -el, back, "reversed, the sign flips")
	cross, err := d.Elapsed(start, other)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, cross, el, "the copy on s2 ran after the one it waited for")

	plain := newEvent(t, d)
	require.NoError(t, d.Record(plain, s1))
	require.NoError(t, d.SyncStream(s1))
	_, err = d.Elapsed(start, plain)
	assert.ErrorIs(t, err, device.ErrInvalidValue, "an event without timing")
}

// testAllocatorSwap runs the swap path: a block is swapped out on a copy
// stream and freed behind the copy; the compute stream reuses it at once and
// overwrites it. The copy must still see the old bytes, which holds only if
// reuse waited for the free's event.
func testAllocatorSwap(t *testing.T, d device.Device) {
	const n = 4 << 20
	a := device.NewAllocator(d)
	t.Cleanup(func() { assert.NoError(t, a.Close()) })
	require.NoError(t, a.Reserve(2*n))
	pool := device.NewHostPool(d)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	require.NoError(t, pool.Reserve(2*n))

	compute := d.DefaultStream()
	copyS := newStream(t, d)
	ev := newEvent(t, d)
	ready := newEvent(t, d)

	for round := range 3 {
		old := pattern(uint64(400+round), n)
		fresh := pattern(uint64(500+round), n)
		freshHost := hostBuf(t, d, fresh)

		p, err := a.Alloc(n, compute)
		require.NoError(t, err)
		require.NoError(t, d.WriteDevice(p, old))

		// Swap out: the copy stream waits for compute, copies, records ev.
		hb, err := pool.Get(n, copyS)
		require.NoError(t, err)
		require.NoError(t, d.Record(ready, compute))
		require.NoError(t, d.StreamWait(copyS, ready))
		require.NoError(t, d.CopyD2H(hb, p, copyS))
		require.NoError(t, d.Record(ev, copyS))
		require.NoError(t, a.FreeAfter(p, ev, copyS))

		// Reuse on compute with no host wait.
		q, err := a.Alloc(n, compute)
		require.NoError(t, err)
		require.Equal(t, p, q, "best fit hands back the freed block")
		require.NoError(t, d.CopyH2D(q, freshHost, compute))

		require.NoError(t, d.SyncStream(copyS))
		equal(t, old, hb.Bytes(), "swap-out copy saw the old bytes")

		// Swap in to a new block and compare.
		r, err := a.Alloc(n, compute)
		require.NoError(t, err)
		require.NoError(t, d.CopyH2D(r, hb, compute))
		require.NoError(t, d.Record(ready, compute))
		require.NoError(t, pool.PutAfter(hb, ready, compute))
		got := make([]byte, n)
		require.NoError(t, d.ReadDevice(got, r))
		equal(t, old, got, "swap-in restores the bytes")
		require.NoError(t, d.ReadDevice(got, q))
		equal(t, fresh, got, "reused block holds the new bytes")
		require.NoError(t, a.Free(q))
		require.NoError(t, a.FreeOn(r, compute))
	}
	st := a.Stats()
	assert.Equal(t, int64(1), st.BackendAllocs, "no backend allocation after Reserve")
	assert.Equal(t, int64(2*n), st.PeakAllocated)
	assert.Zero(t, st.Allocated)
	_, err := a.Alloc(3*n, compute)
	assert.ErrorIs(t, err, device.ErrOutOfMemory)
}

func testHostPool(t *testing.T, d device.Device) {
	pool := device.NewHostPool(d)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	require.NoError(t, pool.Reserve(1<<20))
	s := newStream(t, d)
	p := devBuf(t, d, 1<<20)
	var bufs []device.HostBuf
	for i := range 4 {
		b, err := pool.Get(256<<10, s)
		require.NoError(t, err)
		require.Equal(t, int64(256<<10), b.Len())
		copy(b.Bytes(), pattern(uint64(600+i), 256<<10))
		require.NoError(t, d.CopyH2D(p.Add(int64(i)*256<<10), b, s))
		bufs = append(bufs, b)
	}
	_, err := pool.Get(1, s)
	assert.ErrorIs(t, err, device.ErrOutOfMemory, "pool is full")
	require.NoError(t, d.SyncStream(s))
	got := make([]byte, 1<<20)
	require.NoError(t, d.ReadDevice(got, p))
	for i := range 4 {
		equal(t, pattern(uint64(600+i), 256<<10), got[i*256<<10:(i+1)*256<<10], "slab piece")
	}
	for _, b := range bufs {
		require.NoError(t, pool.Put(b))
	}
	st := pool.Stats()
	assert.Equal(t, int64(1<<20), st.LargestFree, "freed pieces coalesce")
	assert.Equal(t, int64(1), st.BackendAllocs)
}
