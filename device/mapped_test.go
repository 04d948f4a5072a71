package device_test

import (
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/host"
)

// gated is a host device whose copy stream runs only once the allocator
// first waits on the host (SyncEvent): until then every copy and event on
// it is pending, as behind a slow link.
type gated struct {
	*host.Device
	gate chan struct{}
	once sync.Once
}

func (g *gated) open() { g.once.Do(func() { close(g.gate) }) }

func (g *gated) SyncEvent(ev device.Event) error {
	g.open()
	return g.Device.SyncEvent(ev)
}

func (g *gated) ReadDevice(dst []byte, src device.DevPtr) error {
	g.open()
	return g.Device.ReadDevice(dst, src)
}

func (g *gated) SyncStream(s device.Stream) error {
	g.open()
	return g.Device.SyncStream(s)
}

func newGated(t testing.TB, limit, page int64) (*gated, device.Stream) {
	t.Helper()
	d, err := host.New(limit, host.WithPageSize(page))
	require.NoError(t, err)
	g := &gated{Device: d, gate: make(chan struct{})}
	t.Cleanup(func() { g.open(); d.Close() })
	s, err := d.NewStream()
	require.NoError(t, err)
	require.NoError(t, d.Launch(s, func() { <-g.gate }))
	return g, s
}

func newMapped(t testing.TB, limit, page int64) (*host.Device, *device.Allocator) {
	t.Helper()
	d, err := host.New(limit, host.WithPageSize(page))
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	a := device.NewAllocator(d)
	require.NoError(t, a.ReserveMapped(limit))
	t.Cleanup(func() { a.Close() })
	return d, a
}

// TestMappedRandom runs random allocations and frees (plain, behind a copy
// on another stream, and on the compute stream) and checks that every live
// block keeps its bytes and that the pages mapped stay within the limit.
func TestMappedRandom(t *testing.T) {
	const page, limit = 4 << 10, 256 << 10
	d, s := newGated(t, limit, page)
	a := device.NewAllocator(d)
	require.NoError(t, a.ReserveMapped(limit))
	t.Cleanup(func() { a.Close() })
	rng := rand.New(rand.NewPCG(1, 2))
	type live struct {
		p    device.DevPtr
		data []byte
	}
	var lives []live
	var outs, wants [][]byte
	check := func(l live) {
		got := make([]byte, len(l.data))
		require.NoError(t, d.ReadDevice(got, l.p))
		require.Equal(t, l.data, got, "block %#x", l.p)
	}
	for step := range 3000 {
		if len(lives) > 0 && (rng.IntN(2) == 0) {
			k := rng.IntN(len(lives))
			l := lives[k]
			if step%97 == 0 {
				check(l) // waits for every stream: opens the gate
			}
			switch rng.IntN(3) {
			case 0:
				require.NoError(t, a.FreeOn(l.p, 0))
			case 1:
				ev, err := d.NewEvent()
				require.NoError(t, err)
				// The copy out follows the write, as a swap-out follows
				// compute.
				after, err := d.NewEvent()
				require.NoError(t, err)
				require.NoError(t, d.Record(after, 0))
				require.NoError(t, d.StreamWait(s, after))
				out := make([]byte, len(l.data))
				require.NoError(t, d.CopyD2H(device.WrapHost(out), l.p, s))
				require.NoError(t, d.Record(ev, s))
				require.NoError(t, a.FreeAfter(l.p, ev, s))
				outs = append(outs, out)
				wants = append(wants, l.data)
			default:
				require.NoError(t, a.FreeOn(l.p, s))
			}
			lives[k] = lives[len(lives)-1]
			lives = lives[:len(lives)-1]
			continue
		}
		n := int64(1 + rng.IntN(3*page))
		p, err := a.Alloc(n, 0)
		if err != nil {
			require.ErrorIs(t, err, device.ErrOutOfMemory, "step %d", step)
			continue
		}
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		require.NoError(t, d.CopyH2D(p, device.WrapHost(data), 0))
		lives = append(lives, live{p, data})
		st := a.Stats()
		require.LessOrEqual(t, st.Mapped, int64(limit), "step %d", step)
	}
	for _, l := range lives {
		check(l)
	}
	require.NoError(t, d.SyncStream(s))
	for i := range outs {
		require.Equal(t, wants[i], outs[i], "copy %d read the block after it was freed", i)
	}
	assert.LessOrEqual(t, d.PeakAllocated(), int64(limit))
}

// fragment fills an allocator with blocks of two pages and frees every
// other one: half the memory is free, in holes of two pages. It returns the
// blocks kept.
func fragment(t *testing.T, a *device.Allocator, page, limit int64) []device.DevPtr {
	t.Helper()
	var ps, kept []device.DevPtr
	for range limit / (2 * page) {
		p, err := a.Alloc(2*page, 0)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	for i, p := range ps {
		if i%2 == 0 {
			require.NoError(t, a.Free(p))
		} else {
			kept = append(kept, p)
		}
	}
	return kept
}

// TestMappedServesLargeBlockFragmented: with half the memory free in holes
// of two pages, a request for a third of the memory fails on segments
// (no free range is that large) and succeeds on pages, with no eviction:
// the pages of the holes move behind fresh address space.
func TestMappedServesLargeBlockFragmented(t *testing.T) {
	const page, limit = 4 << 10, 64 * 4 << 10
	want := int64(limit / 3)

	seg := device.NewAllocator(newCounting(t, limit))
	require.NoError(t, seg.Reserve(limit))
	t.Cleanup(func() { seg.Close() })
	fragment(t, seg, page, limit)
	_, err := seg.Alloc(want, 0)
	require.ErrorIs(t, err, device.ErrOutOfMemory, "segments: no free range fits")

	d, a := newMapped(t, limit, page)
	fragment(t, a, page, limit)
	before := a.Stats()
	assert.Equal(t, int64(limit/2), before.Free)
	assert.Equal(t, int64(limit/2), before.LargestFree, "what the free pages hold, not the largest hole")
	p, err := a.Alloc(want, 0)
	require.NoError(t, err, "pages: enough are free")
	data := make([]byte, want)
	for i := range data {
		data[i] = byte(i * 7)
	}
	require.NoError(t, d.WriteDevice(p, data))
	got := make([]byte, want)
	require.NoError(t, d.ReadDevice(got, p))
	assert.Equal(t, data, got)
	st := a.Stats()
	assert.LessOrEqual(t, st.Mapped, int64(limit))
	assert.LessOrEqual(t, d.PeakAllocated(), int64(limit), "the device never holds more than the limit")
	assert.Positive(t, st.Unmaps)
	assert.Zero(t, st.HostWaits)
	assert.Positive(t, st.MappedPages, "the pages the block found unmapped were mapped")
	assert.Equal(t, st.MappedPages, st.UnmappedPages, "each page mapped took one page of the budget from elsewhere")

	// Freed, the block's pages are reused in place: no more device calls.
	require.NoError(t, a.Free(p))
	mid := a.Stats()
	for range 10 {
		p, err := a.Alloc(want, 0)
		require.NoError(t, err)
		require.NoError(t, a.Free(p))
	}
	assert.Equal(t, mid.Maps, a.Stats().Maps)
}

func TestMappedSetup(t *testing.T) {
	// A device that cannot map pages.
	a := device.NewAllocator(newCounting(t, 1<<20))
	assert.ErrorIs(t, a.ReserveMapped(1<<20), device.ErrNotSupported)
	require.NoError(t, a.Close())

	d, err := host.New(1<<20, host.WithPageSize(64<<10))
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	a = device.NewAllocator(d)
	assert.ErrorIs(t, a.ReserveMapped(32<<10), device.ErrNotSupported, "under one page")
	assert.ErrorIs(t, a.ReserveMapped(2<<20), device.ErrOutOfMemory, "more than the device holds")
	require.NoError(t, a.Close())

	a = device.NewAllocator(d)
	require.NoError(t, a.ReserveMapped(1<<20))
	assert.ErrorIs(t, a.Reserve(1<<20), device.ErrInvalidValue, "one kind of memory")
	st := a.Stats()
	assert.Equal(t, int64(1<<20), st.Reserved)
	assert.Equal(t, int64(64<<10), st.PageSize)
	assert.Equal(t, int64(1<<20), d.Allocated(), "the budget is mapped up front")
	require.NoError(t, a.Close())
	assert.Zero(t, d.Allocated())
	_, err = a.Alloc(1, 0)
	assert.ErrorIs(t, err, device.ErrClosed)
}

// TestMappedHostWait: pages that only a range still read by a pending copy
// can give are unmapped after the host waits for the copy, which then read
// the right bytes.
func TestMappedHostWait(t *testing.T) {
	const page, limit = 4 << 10, 16 * 4 << 10
	d, s := newGated(t, limit, page)
	a := device.NewAllocator(d)
	require.NoError(t, a.ReserveMapped(limit))
	t.Cleanup(func() { a.Close() })
	// Move one kept block out behind a copy that cannot run yet.
	kept := fragment(t, a, page, limit)
	keep := kept[0] // between two holes, far from fresh address space
	data := make([]byte, 2*page)
	for i := range data {
		data[i] = byte(i)
	}
	require.NoError(t, d.CopyH2D(keep, device.WrapHost(data), s))
	out := make([]byte, len(data))
	ev, err := d.NewEvent()
	require.NoError(t, err)
	require.NoError(t, d.CopyD2H(device.WrapHost(out), keep, s))
	require.NoError(t, d.Record(ev, s))
	require.NoError(t, a.FreeAfter(keep, ev, s))
	// Every free page is needed: the pending range's too.
	_, err = a.Alloc(limit/2+2*page, 0)
	require.NoError(t, err)
	assert.Positive(t, a.Stats().HostWaits)
	require.NoError(t, d.SyncStream(s))
	assert.Equal(t, data, out)
}

// BenchmarkMappedAllocFree is BenchmarkAllocatorAllocFree on a mapped
// allocator over the host backend with CUDA's 2 MiB pages (target: under
// 1 µs and 0 allocations, no device call per op).
func BenchmarkMappedAllocFree(b *testing.B) {
	_, a := newMapped(b, 256<<20, 2<<20)
	keep := make([]device.DevPtr, 0, 64)
	for range 32 { // a fragmented steady state
		p, _ := a.Alloc(1<<20, 0)
		keep = append(keep, p)
	}
	for i := 0; i < len(keep); i += 2 {
		a.Free(keep[i])
	}
	before := a.Stats()
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		p, err := a.Alloc(512<<10, 0)
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Free(p); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.ReportMetric(float64(a.Stats().Maps-before.Maps)/float64(n), "maps/op")
}

// BenchmarkMappedLargeAlloc serves a block larger than any free range of a
// fragmented mapped allocator and frees it: the pages stay where the first
// one put them, so the steady state maps nothing.
func BenchmarkMappedLargeAlloc(b *testing.B) {
	_, a := newMapped(b, 64<<20, 2<<20)
	var ps []device.DevPtr
	for range 16 {
		p, _ := a.Alloc(4<<20, 0)
		ps = append(ps, p)
	}
	for i := 0; i < len(ps); i += 2 {
		a.Free(ps[i])
	}
	b.ReportAllocs()
	for b.Loop() {
		p, err := a.Alloc(24<<20, 0)
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Free(p); err != nil {
			b.Fatal(err)
		}
	}
}

func TestEvictionWindowMapped(t *testing.T) {
	const page = 4 << 10
	tests := []struct {
		name   string
		give   []ent // one page each, in address order, filling 8 pages
		want   int64
		evict  []string
		wantOK bool
	}{
		{
			name:   "free pages suffice",
			give:   []ent{mov("a", page, 1), free(page), free(page), mov("b", page, 2), pin("p", page), free(page), free(page), free(page)},
			want:   4 * page,
			wantOK: true,
		},
		{
			name:   "pages need not be adjacent: the cheapest run, then",
			give:   []ent{mov("a", page, 5), pin("p", page), mov("b", page, 1), mov("c", page, 2), pin("q", page), mov("d", page, 3), free(page), free(page)},
			want:   4 * page,
			evict:  []string{"b", "c"},
			wantOK: true,
		},
		{
			name:   "no run frees enough: least recently used, anywhere",
			give:   []ent{mov("a", page, 5), pin("p", page), mov("b", page, 1), pin("q", page), mov("c", page, 2), pin("r", page), mov("d", page, 3), free(page)},
			want:   3 * page,
			evict:  []string{"b", "c"},
			wantOK: true,
		},
		{
			name:   "everything pinned",
			give:   []ent{pin("p", 4*page), pin("q", 3*page), free(page)},
			want:   2 * page,
			wantOK: false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, a := newMapped(t, 8*page, page)
			var rs []device.Resident
			var names []string
			var frees []device.DevPtr
			for _, e := range tt.give {
				p, err := a.Alloc(e.size, 0)
				require.NoError(t, err)
				if e.kind == 'f' {
					frees = append(frees, p)
					continue
				}
				rs = append(rs, device.Resident{Ptr: p, Movable: e.kind == 'm', Cost: e.size, Age: e.age})
				names = append(names, e.name)
			}
			for _, p := range frees {
				require.NoError(t, a.Free(p))
			}
			idx, ok, err := a.EvictionWindow(tt.want, rs, nil)
			require.NoError(t, err)
			require.Equal(t, tt.wantOK, ok)
			var got []string
			for _, i := range idx {
				got = append(got, names[i])
			}
			assert.Equal(t, tt.evict, got)
			if !ok {
				return
			}
			for _, i := range idx {
				require.NoError(t, a.Free(rs[i].Ptr))
			}
			_, err = a.Alloc(tt.want, 0)
			assert.NoError(t, err, "the eviction makes the request fit")
		})
	}
}

// TestMappedFitsOnAPageInUse: with the page budget full, a small request
// fits only at the start of a free block that begins on a page in use, and
// that block sorts behind more than a few dozen free blocks that would each
// need a page of their own. The allocator finds it: it fails exactly when
// EvictionWindow says an eviction is needed, never in between, where the
// Engine would find nothing to evict.
func TestMappedFitsOnAPageInUse(t *testing.T) {
	const page, holes, fills = 4 << 10, 70, 20
	const budget = 2 + holes + 16*fills // page 0, U2, the separators, the fills
	_, a := newMapped(t, budget*page, page)
	alloc := func(n int64) device.DevPtr {
		t.Helper()
		p, err := a.Alloc(n, 0)
		require.NoError(t, err)
		return p
	}
	alloc(page - 512)        // page 0, but for its last 512 bytes
	h := alloc(2*page + 512) // from there to the end of page 2
	alloc(page)              // page 3
	var hs []device.DevPtr
	for range holes {
		hs = append(hs, alloc(page))
		alloc(page) // keeps the holes apart
	}
	for _, p := range hs {
		require.NoError(t, a.Free(p))
	}
	require.NoError(t, a.Free(h))
	for range fills {
		alloc(16 * page) // too large for any hole: fresh address space
	}
	st := a.Stats()
	require.Equal(t, int64(budget*page), st.InPages, "the page budget is full")
	require.Greater(t, st.FreeBlocks, 64)

	win, ok, err := a.EvictionWindow(512, nil, nil)
	require.NoError(t, err)
	require.True(t, ok)
	require.Empty(t, win, "no eviction needed: 512 bytes fit on page 0")
	p, err := a.Alloc(512, 0)
	require.NoError(t, err, "what EvictionWindow says fits is allocated")
	assert.Equal(t, h, p, "at the start of the free block on page 0")
	assert.Equal(t, int64(budget*page), a.Stats().InPages, "no page added")
}

// TestMappedPlacesOnMappedPagesInsideABlock: a free block whose head lies
// on unmapped pages and whose tail on mapped ones serves a request from its
// tail, with no driver call, rather than mapping pages anew (a map and an
// unmap cost tens of microseconds a page on a GPU).
func TestMappedPlacesOnMappedPagesInsideABlock(t *testing.T) {
	const page, budget = 4 << 10, 64
	const q = budget / 4 * page // a quarter of the budget
	_, a := newMapped(t, budget*page, page)
	alloc := func(n int64) device.DevPtr {
		t.Helper()
		p, err := a.Alloc(n, 0)
		require.NoError(t, err)
		return p
	}
	p1, pa, p2 := alloc(q), alloc(q), alloc(q)
	alloc(q) // the budget is in use
	require.NoError(t, a.Free(p1))
	require.NoError(t, a.Free(p2))
	// Two free quarters, apart: half the budget fits neither, so it takes
	// fresh address space and their pages move behind it.
	alloc(2 * q)
	require.NoError(t, a.Free(pa))
	// Free now: p1's quarter (unmapped) then pa's (mapped), one block;
	// p2's quarter (unmapped); the rest of the address space (unmapped).
	before := a.Stats()
	require.Equal(t, int64(budget*page), before.Mapped)
	p := alloc(q / 2)
	assert.Equal(t, pa, p, "on pa's mapped pages")
	assert.Equal(t, before.Maps, a.Stats().Maps, "no page mapped")
	assert.Equal(t, before.Unmaps, a.Stats().Unmaps, "none unmapped")
}

// mapperOnly hides a device's Remap: the allocator unmaps and maps instead.
type mapperOnly struct {
	device.Device
	device.Mapper
}

// TestMappedMovesPagesWithRemap: on a device that remaps, the pages of the
// holes move to the large block with no unmap and map of their own, the
// same pages as a device that only maps and unmaps takes; the bytes hold
// through either, and the device never holds more than the limit.
func TestMappedMovesPagesWithRemap(t *testing.T) {
	const page, limit = 4 << 10, 64 * 4 << 10
	want := int64(limit / 3)
	run := func(remap bool) device.Stats {
		d, err := host.New(limit, host.WithPageSize(page))
		require.NoError(t, err)
		defer d.Close()
		var dev device.Device = d
		if !remap {
			dev = mapperOnly{d, d}
		}
		_, ok := dev.(device.Remapper)
		require.Equal(t, remap, ok)
		a := device.NewAllocator(dev)
		defer a.Close()
		require.NoError(t, a.ReserveMapped(limit))
		fragment(t, a, page, limit)
		p, err := a.Alloc(want, 0)
		require.NoError(t, err)
		data := make([]byte, want)
		for i := range data {
			data[i] = byte(i * 5)
		}
		require.NoError(t, d.WriteDevice(p, data))
		got := make([]byte, want)
		require.NoError(t, d.ReadDevice(got, p))
		assert.Equal(t, data, got)
		assert.LessOrEqual(t, d.PeakAllocated(), int64(limit))
		return a.Stats()
	}
	moved, plain := run(true), run(false)
	assert.Positive(t, moved.MappedPages)
	assert.Equal(t, plain.MappedPages, moved.MappedPages, "the same pages move")
	assert.Equal(t, moved.MappedPages, moved.UnmappedPages)
}
