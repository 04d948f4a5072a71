package device_test

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/host"
)

// counting wraps a device and records the calls the pools make.
type counting struct {
	device.Device
	mu        sync.Mutex
	waits     []wait
	allocs    int
	newEvents int
}

type wait struct {
	s  device.Stream
	ev device.Event
}

func (c *counting) StreamWait(s device.Stream, ev device.Event) error {
	c.mu.Lock()
	c.waits = append(c.waits, wait{s, ev})
	c.mu.Unlock()
	return c.Device.StreamWait(s, ev)
}

func (c *counting) Alloc(n int64) (device.DevPtr, error) {
	c.mu.Lock()
	c.allocs++
	c.mu.Unlock()
	return c.Device.Alloc(n)
}

func (c *counting) NewEvent() (device.Event, error) {
	c.mu.Lock()
	c.newEvents++
	c.mu.Unlock()
	return c.Device.NewEvent()
}

func (c *counting) takeWaits() []wait {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.waits
	c.waits = nil
	return w
}

func newCounting(t testing.TB, capacity int64) *counting {
	t.Helper()
	d, err := host.New(capacity)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	return &counting{Device: d}
}

func newAllocator(t testing.TB, d device.Device, reserve int64, opts ...device.MemOption) *device.Allocator {
	t.Helper()
	a := device.NewAllocator(d, opts...)
	require.NoError(t, a.Reserve(reserve))
	t.Cleanup(func() { a.Close() })
	return a
}

func TestAllocatorBestFitSplitCoalesce(t *testing.T) {
	d := newCounting(t, 64<<20)
	a := newAllocator(t, d, 1<<20)
	const k = 1 << 10
	x, err := a.Alloc(100*k, 0)
	require.NoError(t, err)
	y, err := a.Alloc(200*k, 0)
	require.NoError(t, err)
	z, err := a.Alloc(300*k, 0)
	require.NoError(t, err)
	assert.Equal(t, x.Add(100*k), y, "blocks are carved in address order")
	assert.Equal(t, y.Add(200*k), z)

	require.NoError(t, a.Free(y))
	st := a.Stats()
	assert.Equal(t, int64(600*k-200*k), st.Allocated)
	assert.Equal(t, int64(1<<20-600*k), st.LargestFree)
	assert.Equal(t, 2, st.FreeBlocks)
	assert.InDelta(t, 1-float64(1<<20-600*k)/float64(1<<20-400*k), st.Fragmentation, 1e-9)

	w, err := a.Alloc(150*k, 0)
	require.NoError(t, err)
	assert.Equal(t, y, w, "best fit takes the 200 KiB hole, not the tail")

	for _, p := range []device.DevPtr{x, z, w} {
		require.NoError(t, a.Free(p))
	}
	st = a.Stats()
	assert.Equal(t, 1, st.FreeBlocks, "everything coalesced")
	assert.Equal(t, int64(1<<20), st.LargestFree)
	assert.Zero(t, st.Fragmentation)
	assert.Equal(t, int64(600*k), st.PeakAllocated)
	assert.Equal(t, 1, d.allocs)

	assert.ErrorIs(t, a.Free(x), device.ErrInvalidValue, "double free")
	_, err = a.Alloc(0, 0)
	assert.ErrorIs(t, err, device.ErrInvalidValue)
}

func TestAllocatorRoundsToAlignment(t *testing.T) {
	d := newCounting(t, 64<<20)
	a := newAllocator(t, d, 1<<20, device.WithAlignment(4096))
	p, err := a.Alloc(1, 0)
	require.NoError(t, err)
	q, err := a.Alloc(4097, 0)
	require.NoError(t, err)
	assert.Equal(t, p.Add(4096), q)
	assert.Equal(t, int64(3*4096), a.Stats().Allocated)
}

func TestAllocatorStreamAwareReuse(t *testing.T) {
	d := newCounting(t, 64<<20)
	a := newAllocator(t, d, 1<<20)
	s1, err := d.NewStream()
	require.NoError(t, err)
	s2, err := d.NewStream()
	require.NoError(t, err)
	ev, err := d.NewEvent()
	require.NoError(t, err)
	// Work still running on s1 when the event is recorded: the event is
	// pending for the whole test (a completed one would need no wait).
	hold := make(chan struct{})
	require.NoError(t, d.Device.(*host.Device).Launch(s1, func() { <-hold }))
	defer close(hold)
	require.NoError(t, d.Record(ev, s1))

	p, err := a.Alloc(1<<20, s1)
	require.NoError(t, err)
	require.NoError(t, a.FreeAfter(p, ev, s1))
	assert.Equal(t, 1, a.Stats().PendingBlocks)
	p, err = a.Alloc(1<<20, s1)
	require.NoError(t, err)
	assert.Empty(t, d.takeWaits(), "same stream: FIFO order covers the free")

	require.NoError(t, a.FreeAfter(p, ev, s1))
	small, err := a.Alloc(4096, s2)
	require.NoError(t, err)
	assert.Equal(t, []wait{{s2, ev}}, d.takeWaits(), "another stream waits on the device")

	// The remainder of the split block still carries the event.
	other, err := a.Alloc(4096, 0)
	require.NoError(t, err)
	assert.Equal(t, []wait{{0, ev}}, d.takeWaits())
	require.NoError(t, a.Free(small))
	require.NoError(t, a.Free(other))
	// Freed plainly after reuse: the waited part carries nothing, but the
	// untouched rest still does, and coalescing keeps the event once.
	_, err = a.Alloc(1<<20, s2)
	require.NoError(t, err)
	assert.Equal(t, []wait{{s2, ev}}, d.takeWaits())
}

func TestAllocatorFreeOn(t *testing.T) {
	d := newCounting(t, 64<<20)
	a := newAllocator(t, d, 1<<20)
	cp, err := d.NewStream()
	require.NoError(t, err)
	const n = 64 << 10
	for range 50 {
		var ps []device.DevPtr
		for range 16 {
			p, err := a.Alloc(n, cp)
			require.NoError(t, err)
			ps = append(ps, p)
		}
		for _, p := range ps {
			require.NoError(t, a.FreeOn(p, cp))
		}
		// Coalesced frees on one stream leave one event: the latest.
		st := a.Stats()
		assert.Equal(t, 1, st.FreeBlocks)
		assert.Empty(t, d.takeWaits())
		p, err := a.Alloc(1<<20, 0)
		require.NoError(t, err)
		w := d.takeWaits()
		require.Len(t, w, 1, "one wait on the copy stream's latest free")
		require.NoError(t, a.Free(p))
	}
	assert.LessOrEqual(t, d.newEvents, 16, "events are recycled once no block refers to them")
	require.NoError(t, a.Close())
	assert.ErrorIs(t, a.FreeOn(0, cp), device.ErrClosed)
}

func TestAllocatorGrowth(t *testing.T) {
	d := newCounting(t, 64<<20)
	a := newAllocator(t, d, 1<<20)
	_, err := a.Alloc(2<<20, 0)
	assert.ErrorIs(t, err, device.ErrOutOfMemory)
	assert.Contains(t, err.Error(), "largest free block 1048576")
	assert.Equal(t, 1, d.allocs, "no backend call on a miss without growth")

	g := newAllocator(t, d, 1<<20, device.WithGrowth(4<<20))
	p, err := g.Alloc(2<<20, 0)
	require.NoError(t, err)
	assert.NotZero(t, p)
	st := g.Stats()
	assert.Equal(t, int64(2), st.BackendAllocs)
	assert.Equal(t, int64(5<<20), st.Reserved)

	// Growth stops at the device's capacity, with the device's error.
	_, err = g.Alloc(100<<20, 0)
	assert.ErrorIs(t, err, device.ErrOutOfMemory)
}

// TestAllocatorRandom compares the allocator with the invariants a plain
// reference keeps: live blocks never overlap and stay inside the segment,
// Allocated is their sum, and freeing everything leaves one block.
func TestAllocatorRandom(t *testing.T) {
	for seed := range uint64(20) {
		d := newCounting(t, 64<<20)
		const size = 4 << 20
		a := newAllocator(t, d, size)
		base, err := a.Alloc(512, 0)
		require.NoError(t, err)
		require.NoError(t, a.Free(base))
		r := rand.New(rand.NewPCG(seed, 1))
		type live struct {
			p device.DevPtr
			n int64
		}
		var blocks []live
		for range 500 {
			if len(blocks) > 0 && r.IntN(3) == 0 {
				i := r.IntN(len(blocks))
				require.NoError(t, a.Free(blocks[i].p))
				blocks = slices.Delete(blocks, i, i+1)
				continue
			}
			n := int64(r.IntN(256<<10) + 1)
			p, err := a.Alloc(n, 0)
			if err != nil {
				require.ErrorIs(t, err, device.ErrOutOfMemory)
				continue
			}
			rounded := (n + 511) / 512 * 512
			for _, b := range blocks {
				require.False(t, p < b.p+device.DevPtr(b.n) && b.p < p+device.DevPtr(rounded),
					"seed %d: %#x+%d overlaps %#x+%d", seed, p, rounded, b.p, b.n)
			}
			require.GreaterOrEqual(t, p, base)
			require.LessOrEqual(t, p+device.DevPtr(rounded), base+size)
			blocks = append(blocks, live{p, rounded})
			var sum int64
			for _, b := range blocks {
				sum += b.n
			}
			require.Equal(t, sum, a.Stats().Allocated)
		}
		for _, b := range blocks {
			require.NoError(t, a.Free(b.p))
		}
		st := a.Stats()
		require.Equal(t, 1, st.FreeBlocks, "seed %d", seed)
		require.Equal(t, int64(size), st.LargestFree)
	}
}

func TestAllocatorConcurrent(t *testing.T) {
	d := newCounting(t, 64<<20)
	a := newAllocator(t, d, 16<<20)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 2))
			var mine []device.DevPtr
			for range 300 {
				if len(mine) > 4 || (len(mine) > 0 && r.IntN(2) == 0) {
					if err := a.Free(mine[0]); err != nil {
						t.Error(err)
						return
					}
					mine = mine[1:]
					continue
				}
				p, err := a.Alloc(int64(r.IntN(64<<10)+1), 0)
				if err != nil {
					t.Error(err)
					return
				}
				mine = append(mine, p)
			}
			for _, p := range mine {
				if err := a.Free(p); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	st := a.Stats()
	assert.Zero(t, st.Allocated)
	assert.Equal(t, 1, st.FreeBlocks)
}

func TestHostPool(t *testing.T) {
	d, err := host.New(1<<20, host.WithHostCapacity(3<<20))
	require.NoError(t, err)
	defer d.Close()
	p := device.NewHostPool(d)
	require.NoError(t, p.Reserve(2<<20))
	b, err := p.Get(1000, 0)
	require.NoError(t, err)
	assert.Equal(t, int64(1000), b.Len())
	assert.Equal(t, 1000, cap(b.Bytes()), "a buffer cannot be grown into its neighbour")
	assert.ErrorIs(t, p.Put(device.WrapHost(make([]byte, 10))), device.ErrInvalidValue)
	require.NoError(t, p.PutOn(b, 0))
	assert.Equal(t, 1, p.Stats().PendingBlocks)

	g := device.NewHostPool(d, device.WithGrowth(1<<20))
	require.NoError(t, g.Reserve(1<<20))
	_, err = g.Get(1<<20, 0)
	require.NoError(t, err)
	_, err = g.Get(1<<20, 0)
	assert.ErrorIs(t, err, device.ErrOutOfMemory, "pinned memory exhausted")
	require.NoError(t, p.Close())
	require.NoError(t, g.Close())
	_, err = p.Get(1, 0)
	assert.ErrorIs(t, err, device.ErrClosed)
}

func BenchmarkAllocatorAllocFree(b *testing.B) {
	d := newCounting(b, 1<<30)
	a := newAllocator(b, d, 256<<20)
	keep := make([]device.DevPtr, 0, 64)
	for range 32 { // a fragmented steady state
		p, _ := a.Alloc(1<<20, 0)
		keep = append(keep, p)
	}
	for i := 0; i < len(keep); i += 2 {
		a.Free(keep[i])
	}
	b.ReportAllocs()
	for b.Loop() {
		p, err := a.Alloc(512<<10, 0)
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Free(p); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAllocatorFreeAfter(b *testing.B) {
	d := newCounting(b, 1<<30)
	a := newAllocator(b, d, 256<<20)
	ev, _ := d.NewEvent()
	b.ReportAllocs()
	for b.Loop() {
		p, err := a.Alloc(1<<20, 1)
		if err != nil {
			b.Fatal(err)
		}
		if err := a.FreeAfter(p, ev, 1); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkHostPoolGetPut(b *testing.B) {
	d := newCounting(b, 1<<20)
	p := device.NewHostPool(d)
	defer p.Close()
	if err := p.Reserve(64 << 20); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		h, err := p.Get(4<<20, 0)
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Put(h); err != nil {
			b.Fatal(err)
		}
	}
}

func TestAllocatorPrefersIdleBlock(t *testing.T) {
	d := newCounting(t, 64<<20)
	a := newAllocator(t, d, 1<<20)
	s1, err := d.NewStream()
	require.NoError(t, err)
	busy, err := d.NewEvent()
	require.NoError(t, err)
	hold := make(chan struct{})
	require.NoError(t, d.Device.(*host.Device).Launch(s1, func() { <-hold }))
	defer close(hold)
	require.NoError(t, d.Record(busy, s1))

	const k = 1 << 10
	x, err := a.Alloc(256*k, 0)
	require.NoError(t, err)
	sep, err := a.Alloc(4*k, 0)
	require.NoError(t, err)
	y, err := a.Alloc(256*k, 0)
	require.NoError(t, err)
	_, err = a.Alloc(512*k-8*k, 0) // the rest, so only x and y can serve
	require.NoError(t, err)
	require.NoError(t, a.FreeAfter(x, busy, s1)) // behind a copy still in flight
	require.NoError(t, a.Free(y))                // idle
	got, err := a.Alloc(256*k, 0)
	require.NoError(t, err)
	assert.Equal(t, y, got, "the idle block, not the one behind the copy")
	assert.Empty(t, d.takeWaits())
	_ = sep
}

// pendingEvents returns a new stream of d held busy until the test ends
// and n events recorded on it behind that work: pending for the whole
// test (a completed one would need no wait).
func pendingEvents(t *testing.T, d *counting, n int) (device.Stream, []device.Event) {
	t.Helper()
	s, err := d.NewStream()
	require.NoError(t, err)
	hold := make(chan struct{})
	require.NoError(t, d.Device.(*host.Device).Launch(s, func() { <-hold }))
	t.Cleanup(func() { close(hold) })
	evs := make([]device.Event, n)
	for i := range evs {
		evs[i], err = d.NewEvent()
		require.NoError(t, err)
		require.NoError(t, d.Record(evs[i], s))
	}
	return s, evs
}

func TestAllocatorWaitsOnOldestFree(t *testing.T) {
	d := newCounting(t, 64<<20)
	a := newAllocator(t, d, 1<<20)
	s1, evs := pendingEvents(t, d, 2)
	evA, evB := evs[0], evs[1]

	const k = 1 << 10
	y, err := a.Alloc(256*k, 0) // lower address
	require.NoError(t, err)
	sep, err := a.Alloc(4*k, 0)
	require.NoError(t, err)
	x, err := a.Alloc(256*k, 0)
	require.NoError(t, err)
	_, err = a.Alloc(512*k-8*k, 0)
	require.NoError(t, err)
	// Both freed behind copies still in flight; x first. Best fit alone
	// would take y (same size, lower address) and wait behind both copies.
	require.NoError(t, a.FreeAfter(x, evA, s1))
	require.NoError(t, a.FreeAfter(y, evB, s1))
	got, err := a.Alloc(256*k, 0)
	require.NoError(t, err)
	assert.Equal(t, x, got, "the block freed first")
	assert.Equal(t, []wait{{0, evA}}, d.takeWaits())
	_ = sep
}

// TestAllocatorWaitsOnlyForItsOwnBytes: memory given back next to a block
// freed behind a copy still in flight coalesces with it, and a request
// served from the idle bytes does not wait for that copy; one served from
// the copy's bytes does.
func TestAllocatorWaitsOnlyForItsOwnBytes(t *testing.T) {
	d := newCounting(t, 64<<20)
	a := newAllocator(t, d, 1<<20)
	s1, evs := pendingEvents(t, d, 1)
	busy := evs[0]

	const k = 1 << 10
	idle, err := a.Alloc(256*k, 0) // lower address
	require.NoError(t, err)
	copying, err := a.Alloc(256*k, 0)
	require.NoError(t, err)
	_, err = a.Alloc(512*k, 0) // the rest
	require.NoError(t, err)
	require.NoError(t, a.FreeAfter(copying, busy, s1))
	require.NoError(t, a.Free(idle)) // coalesces with the block behind the copy
	assert.Equal(t, 1, a.Stats().FreeBlocks)

	got, err := a.Alloc(128*k, 0)
	require.NoError(t, err)
	assert.Equal(t, idle, got, "the start of the coalesced block")
	assert.Empty(t, d.takeWaits(), "its bytes were freed idle")
	next, err := a.Alloc(128*k, 0)
	require.NoError(t, err)
	assert.Empty(t, d.takeWaits(), "still the idle bytes")
	over, err := a.Alloc(256*k, 0)
	require.NoError(t, err)
	assert.Equal(t, copying, over)
	assert.Equal(t, []wait{{0, busy}}, d.takeWaits(), "the copy's bytes wait for the copy")

	// Given back and coalesced again, the event still guards only the
	// copy's bytes: a request across both halves waits once.
	require.NoError(t, a.Free(got))
	require.NoError(t, a.Free(next))
	require.NoError(t, a.FreeAfter(over, busy, s1))
	_, err = a.Alloc(512*k, 0)
	require.NoError(t, err)
	assert.Equal(t, []wait{{0, busy}}, d.takeWaits())
}
