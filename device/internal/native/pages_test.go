package native_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/internal/native"
)

// pageDriver is a driver whose mappings are whole allocations: it fails
// an unmap that is not exactly one mapping, as cuMemUnmap and aclrtUnmapMem do.
type pageDriver struct {
	next     uintptr
	mappings map[uintptr]uintptr // address -> handle
	access   int
	failAt   int // MapPage call that fails, counting from 1; 0 never
	calls    int
	failAcc  bool
}

func (d *pageDriver) MapPage(addr uintptr) (uintptr, error) {
	d.calls++
	if d.calls == d.failAt {
		return 0, device.ErrOutOfMemory
	}
	if _, ok := d.mappings[addr]; ok {
		return 0, errors.New("mapped twice")
	}
	d.next++
	d.mappings[addr] = d.next
	return d.next, nil
}

func (d *pageDriver) Access(addr uintptr, size int64) error {
	if d.failAcc {
		return errors.New("no access")
	}
	d.access++
	return nil
}

func (d *pageDriver) UnmapPage(addr, h uintptr) error {
	if d.mappings[addr] != h {
		return errors.New("not a mapping")
	}
	delete(d.mappings, addr)
	return nil
}

func TestReservations(t *testing.T) {
	const page = 0x1000
	drv := &pageDriver{mappings: map[uintptr]uintptr{}}
	r := &native.Reservations{Backend: "fake", Page: page}
	r.Add(0x100000, 16*page)
	r.Add(0x10000, 4*page)
	assert.Equal(t, 2, r.Len())

	// The allocator maps its budget at once, then unmaps runs inside it.
	require.NoError(t, r.Map(drv, 0x100000, 8*page))
	assert.Len(t, drv.mappings, 8)
	assert.Equal(t, 1, drv.access, "one access call per Map")
	require.NoError(t, r.Unmap(drv, 0x100000+2*page, 3*page), "a part of one Map")
	assert.EqualValues(t, 5, r.MappedPages())
	require.NoError(t, r.Map(drv, 0x100000+8*page, 2*page))
	require.NoError(t, r.Unmap(drv, 0x100000+5*page, 5*page), "the union of two Maps")
	assert.Len(t, drv.mappings, 2)

	tests := []struct {
		name string
		err  error
	}{
		{"double map", r.Map(drv, 0x100000, 2*page)},
		{"unmap of an unmapped page", r.Unmap(drv, 0x100000+page, 2*page)},
		{"outside a reservation", r.Map(drv, 0x200000, page)},
		{"past the end", r.Map(drv, 0x10000+2*page, 4*page)},
		{"not page aligned", r.Map(drv, 0x10000+1, page)},
		{"not whole pages", r.Map(drv, 0x10000, page/2)},
		{"before any reservation", r.Map(drv, 0x1000, page)},
	}
	for _, tt := range tests {
		assert.ErrorIs(t, tt.err, device.ErrInvalidValue, tt.name)
	}
	assert.Len(t, drv.mappings, 2, "a refused call leaves the driver alone")

	// A failing page unmaps what the Map had mapped.
	drv.calls, drv.failAt = 0, 3
	err := r.Map(drv, 0x100000+10*page, 4*page)
	assert.ErrorIs(t, err, device.ErrOutOfMemory)
	assert.Len(t, drv.mappings, 2)
	drv.failAt, drv.failAcc = 0, true
	assert.Error(t, r.Map(drv, 0x100000+10*page, 4*page))
	assert.Len(t, drv.mappings, 2, "failed access: the pages are unmapped")
	drv.failAcc = false
	require.NoError(t, r.Map(drv, 0x100000+10*page, 4*page), "and can be mapped again")

	size, err := r.Release(drv, 0x100000)
	require.NoError(t, err)
	assert.EqualValues(t, 16*page, size)
	assert.Empty(t, drv.mappings)
	_, err = r.Release(drv, 0x100000)
	assert.ErrorIs(t, err, device.ErrInvalidValue)
	assert.Equal(t, 1, r.Len())
}

// moveDriver is pageDriver whose allocations outlive their mappings.
type moveDriver struct {
	pageDriver
	mapFailAt int // MapHandle call that fails, counting from 1; 0 never
	mapCalls  int
}

func (d *moveDriver) UnmapOnly(addr, h uintptr) error {
	if d.mappings[addr] != h {
		return errors.New("not a mapping")
	}
	delete(d.mappings, addr)
	return nil
}

func (d *moveDriver) MapHandle(addr, h uintptr) error {
	d.mapCalls++
	if d.mapCalls == d.mapFailAt {
		return errors.New("map failed")
	}
	if _, ok := d.mappings[addr]; ok {
		return errors.New("mapped twice")
	}
	d.mappings[addr] = h
	return nil
}

// TestReservationsMove: Move takes the same allocations to the new pages
// (no page made or freed), from anywhere, gives access once, refuses what
// is not a move, and on a failure puts every page back where it was.
func TestReservationsMove(t *testing.T) {
	const page, base = 0x1000, 0x100000
	drv := &moveDriver{pageDriver: pageDriver{mappings: map[uintptr]uintptr{}}}
	r := &native.Reservations{Backend: "fake", Page: page}
	r.Add(base, 16*page)
	require.NoError(t, r.Map(drv, base, 4*page))
	before := map[uintptr]uintptr{}
	for a, h := range drv.mappings {
		before[a] = h
	}
	made, access := drv.next, drv.access
	require.NoError(t, r.Move(drv, base+8*page, []uintptr{base + 3*page, base + page}))
	assert.Equal(t, made, drv.next, "no page made")
	assert.Equal(t, access+1, drv.access, "one access call for the new pages")
	assert.Equal(t, before[base+3*page], drv.mappings[base+8*page], "the allocations moved, in order")
	assert.Equal(t, before[base+page], drv.mappings[base+9*page])
	assert.NotContains(t, drv.mappings, uintptr(base+page))
	assert.NotContains(t, drv.mappings, uintptr(base+3*page))
	assert.EqualValues(t, 4, r.MappedPages())
	require.NoError(t, r.Move(drv, base, nil), "nothing to move")

	for name, err := range map[string]error{
		"from an unmapped page": r.Move(drv, base+12*page, []uintptr{base + page}),
		"onto mapped pages":     r.Move(drv, base+8*page, []uintptr{base}),
		"into its own range":    r.Move(drv, base+4*page, []uintptr{base + 5*page}),
		"outside":               r.Move(drv, 0x900000, []uintptr{base}),
		"a source outside":      r.Move(drv, base+12*page, []uintptr{0x900000}),
	} {
		assert.ErrorIs(t, err, device.ErrInvalidValue, name)
	}

	// The third page's map fails: the two moved go back.
	require.NoError(t, r.Map(drv, base+4*page, 3*page))
	snapshot := map[uintptr]uintptr{}
	for a, h := range drv.mappings {
		snapshot[a] = h
	}
	srcs := []uintptr{base + 4*page, base, base + 6*page}
	drv.mapCalls, drv.mapFailAt = 0, 3
	err := r.Move(drv, base+12*page, srcs)
	require.Error(t, err)
	assert.Equal(t, snapshot, drv.mappings, "nothing moved")
	assert.EqualValues(t, 7, r.MappedPages())
	drv.mapFailAt = 0
	require.NoError(t, r.Move(drv, base+12*page, srcs), "and it moves once the driver stops failing")
	assert.Equal(t, snapshot[base], drv.mappings[base+13*page])
}
