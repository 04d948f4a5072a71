package devicetest

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
)

// RunMapper runs the suite of device.Mapper: reserve, map, unmap and
// release with the bytes of mapped pages checked, the misuse a backend must
// refuse (a double map, an unmap of pages not mapped, a range outside a
// reservation), and an Allocator set up with ReserveMapped under a
// fragmenting workload, where a request must fit whenever enough free
// pages exist. newDev returns a fresh device that maps pages (PageSize > 0)
// and can hold at least 32 of them; RunMapper closes it.
func RunMapper(t *testing.T, newDev func(t *testing.T) device.Device, cfg ...MapperConfig) {
	var c MapperConfig
	if len(cfg) > 0 {
		c = cfg[0]
	}
	tests := []struct {
		name string
		fn   func(t *testing.T, d device.Device, m device.Mapper)
	}{
		{"Contract", func(t *testing.T, d device.Device, m device.Mapper) { testMapperContract(t, d, m, c) }},
		{"AllocatorFragmented", testMapperFragmented},
		{"NoFragmentation", testMapperNoFragmentation},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newDev(t)
			t.Cleanup(func() { assert.NoError(t, d.Close()) })
			m, ok := d.(device.Mapper)
			require.True(t, ok, "%s is not a device.Mapper", d.Name())
			page := m.PageSize()
			require.Positive(t, page, "%s does not map pages", d.Name())
			require.Zero(t, page&(page-1), "page size %d is not a power of two", page)
			tt.fn(t, d, m)
		})
	}
}

// MapperConfig adapts RunMapper to a backend.
type MapperConfig struct {
	// NoFaults skips the reads of reserved pages that are not mapped,
	// which must fail: on a GPU such a read may fault and leave the
	// context unusable for the rest of the process.
	NoFaults bool
}

func testMapperContract(t *testing.T, d device.Device, m device.Mapper, c MapperConfig) {
	page := m.PageSize()
	_, err := m.ReserveAddress(page + 1)
	assert.ErrorIs(t, err, device.ErrInvalidValue, "whole pages")
	p, err := m.ReserveAddress(8 * page)
	require.NoError(t, err)
	require.NotZero(t, p)
	require.Zero(t, uintptr(p)%uintptr(page), "a reservation starts on a page")

	if !c.NoFaults {
		assert.Error(t, d.ReadDevice(make([]byte, page), p), "no memory behind a reservation")
	}

	free0, _, err := d.MemInfo()
	require.NoError(t, err)
	require.NoError(t, m.Map(p.Add(page), 3*page))
	free1, _, err := d.MemInfo()
	require.NoError(t, err)
	assert.LessOrEqual(t, free1, free0-3*page, "mapped pages take memory")
	assert.ErrorIs(t, m.Map(p.Add(3*page), 2*page), device.ErrInvalidValue, "page 3 is mapped already")
	assert.ErrorIs(t, m.Map(p.Add(7*page), 2*page), device.ErrInvalidValue, "past the reservation")
	assert.ErrorIs(t, m.Unmap(p.Add(4*page), page), device.ErrInvalidValue, "page 4 is not mapped")

	// Bytes through both paths: the synchronous one and a stream's copies.
	want := pattern(21, int(3*page))
	require.NoError(t, d.WriteDevice(p.Add(page), want))
	got := make([]byte, 3*page)
	require.NoError(t, d.ReadDevice(got, p.Add(page)))
	equal(t, want, got, "mapped pages hold their bytes")
	s := newStream(t, d)
	src := hostBuf(t, d, pattern(22, int(page)))
	dst := hostBuf(t, d, make([]byte, 2*page))
	require.NoError(t, d.CopyH2D(p.Add(3*page), src, s))
	require.NoError(t, d.CopyD2H(dst, p.Add(2*page), s))
	require.NoError(t, d.SyncStream(s))
	equal(t, want[page:2*page], dst.Bytes()[:page], "copy out of a mapped page")
	equal(t, src.Bytes(), dst.Bytes()[page:], "copy into a mapped page, then out")

	// A part of the Map: the middle page. Its neighbours keep their bytes.
	require.NoError(t, m.Unmap(p.Add(2*page), page))
	assert.ErrorIs(t, m.Unmap(p.Add(2*page), page), device.ErrInvalidValue, "unmapped twice")
	if !c.NoFaults {
		assert.Error(t, d.ReadDevice(got, p.Add(page)), "a page of the range is unmapped")
	}
	require.NoError(t, d.ReadDevice(got[:page], p.Add(page)))
	equal(t, want[:page], got[:page], "the page before the hole")
	require.NoError(t, m.Map(p.Add(2*page), page))
	require.NoError(t, d.ReadDevice(got[:page], p.Add(3*page)))
	equal(t, src.Bytes(), got[:page], "the page after the hole")

	// The union of two Maps, and one page of the first.
	require.NoError(t, m.Map(p.Add(4*page), 2*page))
	require.NoError(t, m.Unmap(p.Add(2*page), 4*page))
	require.NoError(t, d.WriteDevice(p.Add(page), want[:page]), "the first page is still mapped")

	q, err := m.ReserveAddress(2 * page)
	require.NoError(t, err)
	assert.True(t, q >= p.Add(8*page) || q.Add(2*page) <= p, "reservations overlap: %#x %#x", p, q)
	require.NoError(t, m.Map(q, 2*page))

	require.NoError(t, m.ReleaseAddress(p), "pages still mapped are unmapped")
	assert.ErrorIs(t, m.ReleaseAddress(p), device.ErrInvalidValue, "released twice")
	assert.Error(t, m.Map(p, page), "the range is gone")
	require.NoError(t, m.ReleaseAddress(q))
	free2, _, err := d.MemInfo()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, free2, free1+3*page-page/2, "released pages give their memory back")
}

// testMapperFragmented: with half the pages free in holes of two, a
// request for a third of the limit fits without eviction.
func testMapperFragmented(t *testing.T, d device.Device, m device.Mapper) {
	page := m.PageSize()
	limit := 16 * page
	a := device.NewAllocator(d)
	t.Cleanup(func() { assert.NoError(t, a.Close()) })
	require.NoError(t, a.ReserveMapped(limit))
	var all, kept []device.DevPtr
	for range limit / (2 * page) {
		p, err := a.Alloc(2*page, 0)
		require.NoError(t, err)
		all = append(all, p)
	}
	for i, p := range all {
		if i%2 == 0 {
			require.NoError(t, a.Free(p))
		} else {
			kept = append(kept, p)
		}
	}
	require.Equal(t, limit/2, a.Stats().Free, "half the pages free, in holes of two")
	for i, p := range kept {
		require.NoError(t, d.WriteDevice(p, pattern(uint64(40+i), int(2*page))))
	}
	want := limit / 3
	p, err := a.Alloc(want, 0)
	require.NoError(t, err, "enough pages are free")
	data := pattern(50, int(want))
	require.NoError(t, d.WriteDevice(p, data))
	got := make([]byte, want)
	require.NoError(t, d.ReadDevice(got, p))
	equal(t, data, got, "the large block")
	for i, k := range kept {
		b := make([]byte, 2*page)
		require.NoError(t, d.ReadDevice(b, k))
		equal(t, pattern(uint64(40+i), int(2*page)), b, "a kept block")
	}
	st := a.Stats()
	assert.LessOrEqual(t, st.Mapped, limit)
	assert.Positive(t, st.Unmaps, "pages moved behind the large block")
	assert.Zero(t, st.HostWaits)
}

// testMapperNoFragmentation runs random allocations and frees on a mapped
// allocator and checks, before each allocation, the promise of
// ReserveMapped: a request fails only when the pages no live block
// touches are fewer than the request can need (its pages and one more
// for a block that straddles). Sizes are not page multiples, so blocks
// share pages and free memory is split every which way.
func testMapperNoFragmentation(t *testing.T, d device.Device, m device.Mapper) {
	page := m.PageSize()
	const budget = 24
	a := device.NewAllocator(d)
	t.Cleanup(func() { assert.NoError(t, a.Close()) })
	require.NoError(t, a.ReserveMapped(budget*page))
	rng := rand.New(rand.NewPCG(7, 8))
	type block struct {
		p    device.DevPtr
		size int64
	}
	var live []block
	used := func() int64 {
		pages := map[uintptr]bool{}
		for _, b := range live {
			for q := uintptr(b.p) / uintptr(page); q <= (uintptr(b.p)+uintptr(b.size)-1)/uintptr(page); q++ {
				pages[q] = true
			}
		}
		return int64(len(pages))
	}
	fails := 0
	for step := range 400 {
		if len(live) > 0 && rng.IntN(5) < 2 {
			k := rng.IntN(len(live))
			require.NoError(t, a.Free(live[k].p))
			live[k] = live[len(live)-1]
			live = live[:len(live)-1]
			continue
		}
		size := 1 + rng.Int64N(3*page)
		need := (size+page-1)/page + 1
		free := budget - used()
		p, err := a.Alloc(size, 0)
		if err != nil {
			require.ErrorIs(t, err, device.ErrOutOfMemory, "step %d", step)
			require.Less(t, free, need, "step %d: %d bytes refused with %d of %d pages free", step, size, free, budget)
			fails++
			continue
		}
		live = append(live, block{p, size})
		require.LessOrEqual(t, a.Stats().Mapped, budget*page, "step %d", step)
	}
	t.Logf("%d refusals, all for want of pages; %d maps, %d unmaps", fails, a.Stats().Maps, a.Stats().Unmaps)
	for _, b := range live {
		require.NoError(t, a.Free(b.p))
	}
}
