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
	benchSwapOp(b, d, 4096)
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
func benchSwapOp(b *testing.B, d device.Device, size int64) {
	const ring = 64
	a := device.NewAllocator(d)
	defer a.Close()
	if err := a.Reserve(4 * ring * size); err != nil {
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
