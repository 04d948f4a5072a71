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
