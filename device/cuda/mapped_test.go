package cuda

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/cuda/driver"
	"github.com/chameleon-go/chameleon/device/devicetest"
)

const fakePage = 64 << 10

// newMappedFake is newFake with the fake's granularity at 64 KiB, so that
// the tests map many pages in little memory.
func newMappedFake(t testing.TB, opts ...Option) (*Device, *fakeCtl) {
	t.Helper()
	path := buildFake(t, "default")
	ctl := openFake(t, path)
	ctl.setGranularity(fakePage)
	d, err := New(append([]Option{WithLibrary(path), WithDriverLibrary(path), WithPageSize(fakePage)}, opts...)...)
	require.NoError(t, err)
	require.NoError(t, d.Mapping())
	require.EqualValues(t, fakePage, d.PageSize())
	return d, ctl
}

func TestMapperConformanceFake(t *testing.T) {
	devicetest.RunMapper(t, func(t *testing.T) device.Device {
		d, ctl := newMappedFake(t)
		t.Cleanup(func() {
			assert.Zero(t, ctl.reservations(), "every reservation released")
			assert.Zero(t, ctl.liveHandles(), "every allocation released")
			assert.Zero(t, ctl.netPushes(), "every context push popped")
		})
		return d
	})
}

// TestMapCalls checks what Map and Unmap ask the driver: one cuMemCreate
// and cuMemMap per page, one cuMemSetAccess per Map, one cuMemUnmap and
// cuMemRelease per page, in the device's primary context.
func TestMapCalls(t *testing.T) {
	d, ctl := newMappedFake(t, WithDevice(1))
	defer d.Close()
	assert.EqualValues(t, 1, ctl.retained(1), "the primary context of device 1 is retained")
	p, err := d.ReserveAddress(8 * fakePage)
	require.NoError(t, err)
	require.NoError(t, d.Map(p, 6*fakePage))
	assert.EqualValues(t, 6, ctl.vmmCount(vmmCreates))
	assert.EqualValues(t, 6, ctl.vmmCount(vmmMaps))
	assert.EqualValues(t, 1, ctl.vmmCount(vmmAccess))
	assert.EqualValues(t, 6*fakePage, ctl.mappedBytes())
	// Parts of the one Map, as the allocator unmaps cached pages.
	require.NoError(t, d.Unmap(p.Add(fakePage), 2*fakePage))
	require.NoError(t, d.Unmap(p.Add(4*fakePage), fakePage))
	assert.EqualValues(t, 3, ctl.vmmCount(vmmUnmaps))
	assert.EqualValues(t, 3, ctl.vmmCount(vmmReleases))
	assert.EqualValues(t, 3, ctl.liveHandles())
	assert.EqualValues(t, 3*fakePage, ctl.used(), "unmapped pages give their memory back")
	require.NoError(t, d.ReleaseAddress(p))
	assert.Zero(t, ctl.liveHandles())
	assert.Zero(t, ctl.reservations())
	assert.Zero(t, ctl.netPushes())
	require.NoError(t, d.Close())
	assert.Zero(t, ctl.retained(1), "Close gives the context back")
}

// TestMapErrors: a failing cuMemCreate is device.ErrOutOfMemory; a failing
// cuMemCreate or cuMemMap in the middle of a range leaves nothing mapped.
func TestMapErrors(t *testing.T) {
	d, ctl := newMappedFake(t)
	defer d.Close()
	p, err := d.ReserveAddress(16 * fakePage)
	require.NoError(t, err)
	require.NoError(t, d.Map(p, 2*fakePage))
	before := ctl.used()

	ctl.failCreateIn(3)
	err = d.Map(p.Add(4*fakePage), 6*fakePage)
	require.Error(t, err)
	assert.ErrorIs(t, err, device.ErrOutOfMemory)
	assert.ErrorContains(t, err, "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (2)")
	var de *driver.Error
	require.True(t, errors.As(err, &de))
	assert.Equal(t, "cuMemCreate", de.Call)
	assert.EqualValues(t, 2, ctl.liveHandles(), "the pages created before the failure are released")
	assert.EqualValues(t, 2*fakePage, ctl.mappedBytes())
	assert.Equal(t, before, ctl.used())

	ctl.failMapIn(2, 999)
	err = d.Map(p.Add(4*fakePage), 6*fakePage)
	require.Error(t, err)
	assert.ErrorContains(t, err, "cuMemMap: CUDA_ERROR_UNKNOWN (999)")
	assert.False(t, errors.Is(err, device.ErrOutOfMemory))
	assert.EqualValues(t, 2, ctl.liveHandles(), "a failed cuMemMap leaves nothing behind")
	assert.EqualValues(t, 2*fakePage, ctl.mappedBytes())
	assert.Equal(t, before, ctl.used())

	// The range maps once the driver stops failing.
	require.NoError(t, d.Map(p.Add(4*fakePage), 6*fakePage))
	ctl.setTotal(ctl.used() + fakePage)
	err = d.Map(p.Add(10*fakePage), 2*fakePage)
	assert.ErrorIs(t, err, device.ErrOutOfMemory, "the device is full")
	assert.EqualValues(t, 8*fakePage, ctl.mappedBytes())

	// Through the allocator, the error keeps its sentinel.
	a := device.NewAllocator(d)
	defer a.Close()
	err = a.ReserveMapped(32 * fakePage)
	assert.ErrorIs(t, err, device.ErrOutOfMemory)
	require.NoError(t, d.ReleaseAddress(p))
	assert.Zero(t, ctl.liveHandles())
}

// TestAccessBeforeMap: the fake faults copies into reserved pages that are
// not mapped, as the GPU would; mapped ones work.
func TestAccessBeforeMap(t *testing.T) {
	d, _ := newMappedFake(t)
	defer d.Close()
	p, err := d.ReserveAddress(4 * fakePage)
	require.NoError(t, err)
	buf := make([]byte, fakePage)
	err = d.WriteDevice(p, buf)
	assert.ErrorContains(t, err, "cudaErrorIllegalAddress")
	h, err := d.AllocHost(fakePage)
	require.NoError(t, err)
	defer d.FreeHost(h)
	assert.ErrorContains(t, d.CopyH2D(p.Add(fakePage), h, 0), "cudaErrorIllegalAddress")
	require.NoError(t, d.Map(p, fakePage))
	require.NoError(t, d.WriteDevice(p, buf))
	assert.Error(t, d.WriteDevice(p.Add(fakePage/2), buf), "half of it outside the mapped page")
	require.NoError(t, d.ReleaseAddress(p))
}

// TestMappingFallback: without libcuda's calls the device does not map,
// and the allocator says so, so that the Engine takes plain segments.
func TestMappingFallback(t *testing.T) {
	for _, tt := range []struct {
		name    string
		variant string
		flags   []string
		opts    []Option
		want    string
	}{
		{"no virtual memory management", "novmm", []string{"-DOMIT_VMM"}, nil, "cuMemGetAllocationGranularity"},
		{"no driver", "nodriver", []string{"-DOMIT_DRIVER"}, nil, "cuInit"},
		{"turned off", "default", nil, []Option{WithoutMapping()}, "WithoutMapping"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := buildFake(t, tt.variant, tt.flags...)
			var d *Device
			var err error
			require.NotPanics(t, func() {
				d, err = New(append([]Option{WithLibrary(path), WithDriverLibrary(path)}, tt.opts...)...)
			})
			require.NoError(t, err, "the device works without mapping")
			defer d.Close()
			assert.Zero(t, d.PageSize())
			assert.ErrorContains(t, d.Mapping(), tt.want)
			if _, err = d.Context(); tt.variant == "default" {
				assert.NoError(t, err, "turned off, the driver's context still launches kernels")
			} else {
				assert.Error(t, err)
			}
			_, err = d.ReserveAddress(fakePage)
			assert.ErrorIs(t, err, device.ErrNotSupported)
			assert.ErrorIs(t, d.Map(0, fakePage), device.ErrNotSupported)
			a := device.NewAllocator(d)
			defer a.Close()
			assert.ErrorIs(t, a.ReserveMapped(1<<20), device.ErrNotSupported)
			require.NoError(t, a.Reserve(1<<20))
			p, err := a.Alloc(4096, 0)
			require.NoError(t, err)
			require.NoError(t, a.Free(p))
		})
	}
}

func TestMapClosed(t *testing.T) {
	d, _ := newMappedFake(t)
	p, err := d.ReserveAddress(fakePage)
	require.NoError(t, err)
	require.NoError(t, d.ReleaseAddress(p))
	require.NoError(t, d.Close())
	_, err = d.ReserveAddress(fakePage)
	assert.ErrorIs(t, err, device.ErrClosed)
	assert.ErrorIs(t, d.Map(p, fakePage), device.ErrClosed)
}

// TestFakeDriverRefusesMisuse calls the fake's driver directly, past the
// bookkeeping, to show that the model bites: each wrong use gets the
// driver's error, as a real driver would give it.
func TestFakeDriverRefusesMisuse(t *testing.T) {
	d, ctl := newMappedFake(t)
	defer d.Close()
	m := d.vmm
	const invalidValue, invalidContext = 1, 201
	page := uintptr(fakePage)
	m.mu.Lock()
	defer m.mu.Unlock()
	v, sc := m.v, m.sc
	assert.EqualValues(t, invalidContext, v.Reserve(&sc.ptr, 4*page), "no context current")

	require.NoError(t, m.ctx.Enter())
	defer m.ctx.Leave()
	require.Zero(t, v.Reserve(&sc.ptr, 4*page))
	base := sc.ptr
	require.Zero(t, v.Create(&sc.handle, 2*page, &sc.prop))
	two := sc.handle
	require.Zero(t, v.Create(&sc.handle, page, &sc.prop))
	one := sc.handle

	other := driver.DeviceMemory(1)
	assert.EqualValues(t, invalidValue, v.Create(&sc.handle, page, &other), "memory of a device whose context is not current")
	assert.EqualValues(t, invalidValue, v.Map(base+4*page, page, one), "outside the reservation")
	assert.EqualValues(t, invalidValue, v.Map(base, page, two), "a size other than the allocation's")
	require.Zero(t, v.Map(base, 2*page, two))
	assert.EqualValues(t, invalidValue, v.Map(base+page, page, one), "over a mapped page")
	assert.EqualValues(t, invalidValue, v.SetAccess(base, 3*page, &sc.access), "access to a page not mapped")
	assert.EqualValues(t, invalidValue, v.Unmap(base, page), "a part of a mapping")
	assert.EqualValues(t, invalidValue, v.Unmap(base+2*page, page), "a page not mapped")
	assert.EqualValues(t, invalidValue, v.Free(base, 4*page), "address space with a mapping")
	require.Zero(t, v.Unmap(base, 2*page))
	require.Zero(t, v.Release(two))
	assert.EqualValues(t, invalidValue, v.Release(two), "released twice")
	require.Zero(t, v.Release(one))
	require.Zero(t, v.Free(base, 4*page))
	assert.Zero(t, ctl.liveHandles())
}

// TestRemapCalls: Remap moves pages' allocations with a cuMemUnmap and a
// cuMemMap each and one cuMemSetAccess, never making or freeing memory;
// the bytes through the moved pages read back.
func TestRemapCalls(t *testing.T) {
	d, ctl := newMappedFake(t)
	defer d.Close()
	p, err := d.ReserveAddress(8 * fakePage)
	require.NoError(t, err)
	require.NoError(t, d.Map(p, 4*fakePage))
	creates, maps, access, unmaps, releases := ctl.vmmCount(vmmCreates), ctl.vmmCount(vmmMaps), ctl.vmmCount(vmmAccess), ctl.vmmCount(vmmUnmaps), ctl.vmmCount(vmmReleases)
	used := ctl.used()
	require.NoError(t, d.Remap(p.Add(5*fakePage), []device.DevPtr{p.Add(fakePage), p.Add(2 * fakePage)}))
	assert.Equal(t, creates, ctl.vmmCount(vmmCreates), "no cuMemCreate")
	assert.Equal(t, releases, ctl.vmmCount(vmmReleases), "no cuMemRelease")
	assert.Equal(t, maps+2, ctl.vmmCount(vmmMaps))
	assert.Equal(t, unmaps+2, ctl.vmmCount(vmmUnmaps))
	assert.Equal(t, access+1, ctl.vmmCount(vmmAccess))
	assert.Equal(t, used, ctl.used(), "the device's memory in use is the same")
	assert.EqualValues(t, 4, ctl.liveHandles())
	buf := make([]byte, 2*fakePage)
	for i := range buf {
		buf[i] = byte(i * 3)
	}
	require.NoError(t, d.WriteDevice(p.Add(5*fakePage), buf))
	got := make([]byte, len(buf))
	require.NoError(t, d.ReadDevice(got, p.Add(5*fakePage)))
	assert.Equal(t, buf, got)
	assert.ErrorContains(t, d.WriteDevice(p.Add(fakePage), buf[:fakePage]), "cudaErrorIllegalAddress", "the old pages are unmapped")
	assert.ErrorIs(t, d.Remap(p.Add(5*fakePage), []device.DevPtr{p}), device.ErrInvalidValue, "onto a mapped page")
	require.NoError(t, d.ReleaseAddress(p))
	assert.Zero(t, ctl.liveHandles())
}

// TestPageSize: WithPageSize makes each mapped page one allocation of that
// size; a size under the granularity or not a power of two is refused.
func TestPageSize(t *testing.T) {
	path := buildFake(t, "default")
	ctl := openFake(t, path)
	ctl.setGranularity(fakePage)
	d, err := New(WithLibrary(path), WithDriverLibrary(path), WithPageSize(4*fakePage))
	require.NoError(t, err)
	defer d.Close()
	assert.EqualValues(t, 4*fakePage, d.PageSize())
	p, err := d.ReserveAddress(8 * fakePage)
	require.NoError(t, err)
	creates := ctl.vmmCount(vmmCreates)
	require.NoError(t, d.Map(p, 8*fakePage))
	assert.Equal(t, creates+2, ctl.vmmCount(vmmCreates), "two allocations of four granules")
	require.NoError(t, d.ReleaseAddress(p))
	def, err := New(WithLibrary(path), WithDriverLibrary(path))
	require.NoError(t, err)
	assert.EqualValues(t, fakePage, def.PageSize(), "the granularity until sized")
	def.SizePages(1 << 40)
	assert.EqualValues(t, DefaultPageSize, def.PageSize(), "a large limit: DefaultPageSize")
	def.SizePages(8 * fakePage * 1024)
	assert.EqualValues(t, 8*fakePage, def.PageSize(), "limit/1024")
	def.SizePages(1)
	assert.EqualValues(t, fakePage, def.PageSize(), "never under the granularity")
	a := device.NewAllocator(def)
	require.NoError(t, a.ReserveMapped(4*fakePage*1024))
	assert.EqualValues(t, 4*fakePage, def.PageSize(), "ReserveMapped sizes the pages for its limit")
	def.SizePages(1 << 40)
	assert.EqualValues(t, 4*fakePage, def.PageSize(), "not once an address is reserved")
	require.NoError(t, a.Close())
	require.NoError(t, def.Close())
	d.SizePages(1 << 40)
	assert.EqualValues(t, 4*fakePage, d.PageSize(), "WithPageSize stays")
	for _, bad := range []int64{fakePage / 2, 3 * fakePage} {
		_, err := New(WithLibrary(path), WithDriverLibrary(path), WithPageSize(bad))
		assert.ErrorIs(t, err, device.ErrInvalidValue, "%d", bad)
	}
}
