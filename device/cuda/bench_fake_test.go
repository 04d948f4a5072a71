package cuda

import (
	"testing"

	"github.com/chameleon-go/chameleon/device"
)

// BenchmarkSwapOpFake measures the host cost of one swap operation through
// the bindings (allocator alloc, event record, async copy, free-after) with
// the fake runtime, whose calls do almost nothing: what remains is purego and
// this package.
func BenchmarkSwapOpFake(b *testing.B) {
	d, _ := newFake(b)
	defer d.Close()
	benchSwapOp(b, d, 4096, false)
}

// BenchmarkSwapOpMappedFake is BenchmarkSwapOpFake with the allocator on
// mapped pages (2 MiB, the fake's default granularity), as the Engine sets
// it up on a GPU whose driver maps: the target is the same, at or under
// 5 µs on the H200 and a fraction of it here.
func BenchmarkSwapOpMappedFake(b *testing.B) {
	d, _ := newFake(b)
	defer d.Close()
	benchSwapOp(b, d, 4096, true)
}

// BenchmarkMappedAllocFreeFake is the allocation path of a mapped
// allocator over the fake driver in a fragmented steady state (target:
// under 1 µs and 0 allocations; maps/op must be 0: no driver call).
func BenchmarkMappedAllocFreeFake(b *testing.B) {
	d, _ := newFake(b)
	defer d.Close()
	a := device.NewAllocator(d)
	defer a.Close()
	if err := a.ReserveMapped(256 << 20); err != nil {
		b.Fatal(err)
	}
	keep := make([]device.DevPtr, 0, 64)
	for range 32 {
		p, err := a.Alloc(1<<20, 0)
		if err != nil {
			b.Fatal(err)
		}
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

// BenchmarkMapUnmapPageFake is the cost of the driver path behind one page
// when fragmentation moves it: Map (cuMemCreate, cuMemMap, cuMemSetAccess)
// and Unmap (cuMemUnmap, cuMemRelease) with the context pushed and popped.
func BenchmarkMapUnmapPageFake(b *testing.B) {
	d, _ := newFake(b)
	defer d.Close()
	page := d.PageSize()
	p, err := d.ReserveAddress(page)
	if err != nil {
		b.Fatal(err)
	}
	defer d.ReleaseAddress(p)
	b.ReportAllocs()
	for b.Loop() {
		if err := d.Map(p, page); err != nil {
			b.Fatal(err)
		}
		if err := d.Unmap(p, page); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRecordFake measures one bound call.
func BenchmarkRecordFake(b *testing.B) {
	d, _ := newFake(b)
	defer d.Close()
	ev, err := d.NewEvent()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := d.Record(ev, 0); err != nil {
			b.Fatal(err)
		}
	}
}

// benchSwapOp issues swap operations of size bytes as the engine does: alloc
// from a warm caching allocator on the copy stream, async copy, record the
// copy's event (the engine needs it to order the compute stream), and free
// the block behind it with FreeAfter. Events come from a ring, as an engine
// keeps them.
func benchSwapOp(b *testing.B, d device.Device, size int64, mapped bool) {
	const ring = 64
	a := device.NewAllocator(d)
	defer a.Close()
	reserve, limit := a.Reserve, 4*ring*size
	if mapped {
		// At least a few pages of the device's size.
		reserve, limit = a.ReserveMapped, max(limit, 4*d.(device.Mapper).PageSize())
	}
	if err := reserve(limit); err != nil {
		b.Fatal(err)
	}
	pool := device.NewHostPool(d)
	defer pool.Close()
	if err := pool.Reserve(size); err != nil {
		b.Fatal(err)
	}
	hb, err := pool.Get(size, 0)
	if err != nil {
		b.Fatal(err)
	}
	s, err := d.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer d.DestroyStream(s)
	evs := make([]device.Event, ring)
	for i := range evs {
		if evs[i], err = d.NewEvent(); err != nil {
			b.Fatal(err)
		}
	}
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		p, err := a.Alloc(size, s)
		if err != nil {
			b.Fatal(err)
		}
		ev := evs[i%ring]
		i++
		if err := d.CopyD2H(hb, p, s); err != nil {
			b.Fatal(err)
		}
		if err := d.Record(ev, s); err != nil {
			b.Fatal(err)
		}
		if err := a.FreeAfter(p, ev, s); err != nil {
			b.Fatal(err)
		}
		if i%ring == 0 {
			b.StopTimer()
			if err := d.SyncStream(s); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
	b.StopTimer()
	if err := d.SyncStream(s); err != nil {
		b.Fatal(err)
	}
}
