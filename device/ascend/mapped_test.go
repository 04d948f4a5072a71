package ascend

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/devicetest"
	"github.com/chameleon-go/chameleon/internal/dl"
)

const fakePage = 64 << 10

// vmmCtl drives the fake's virtual memory model.
type vmmCtl struct {
	setGranularity func(n int64)
	failMallocIn   func(n int64)
	failMapIn      func(n int64, code int32)
	vmmCount       func(i int32) int64
	liveHandles    func() int64
	reservations   func() int64
	used           func() int64
}

// Indices of fake_vmm_count, as in fakeascendcl.c.
const (
	vmmMallocs = iota
	vmmMaps
	vmmUnmaps
	vmmFrees
)

func openVMM(t testing.TB, path string) *vmmCtl {
	t.Helper()
	lib, err := dl.Open([]string{path}, os.ErrNotExist)
	require.NoError(t, err)
	c := &vmmCtl{}
	require.NoError(t, lib.Bind(
		dl.Func{Ptr: &c.setGranularity, Name: "fake_set_granularity"},
		dl.Func{Ptr: &c.failMallocIn, Name: "fake_fail_malloc_physical_after"},
		dl.Func{Ptr: &c.failMapIn, Name: "fake_fail_map_after"},
		dl.Func{Ptr: &c.vmmCount, Name: "fake_vmm_count"},
		dl.Func{Ptr: &c.liveHandles, Name: "fake_live_handles"},
		dl.Func{Ptr: &c.reservations, Name: "fake_reservations"},
		dl.Func{Ptr: &c.used, Name: "fake_used"},
	))
	return c
}

// newMappedFake is newFake with the fake's granularity at 64 KiB.
func newMappedFake(t testing.TB, opts ...Option) (*Device, *vmmCtl) {
	t.Helper()
	path := buildFake(t, "default")
	openFake(t, path) // resets
	ctl := openVMM(t, path)
	ctl.setGranularity(fakePage)
	d, err := New(append([]Option{WithLibrary(path)}, opts...)...)
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
			assert.Zero(t, ctl.liveHandles(), "every allocation freed")
		})
		return d
	})
}

func TestMapCalls(t *testing.T) {
	d, ctl := newMappedFake(t, WithDevice(1))
	defer d.Close()
	p, err := d.ReserveAddress(8 * fakePage)
	require.NoError(t, err)
	require.NoError(t, d.Map(p, 6*fakePage))
	assert.EqualValues(t, 6, ctl.vmmCount(vmmMallocs), "one physical allocation per page")
	assert.EqualValues(t, 6, ctl.vmmCount(vmmMaps))
	require.NoError(t, d.Unmap(p.Add(fakePage), 2*fakePage))
	assert.EqualValues(t, 2, ctl.vmmCount(vmmUnmaps))
	assert.EqualValues(t, 2, ctl.vmmCount(vmmFrees))
	assert.EqualValues(t, 4*fakePage, ctl.used())
	require.NoError(t, d.ReleaseAddress(p))
	assert.Zero(t, ctl.liveHandles())
	assert.Zero(t, ctl.reservations())
}

func TestMapErrors(t *testing.T) {
	d, ctl := newMappedFake(t)
	defer d.Close()
	p, err := d.ReserveAddress(16 * fakePage)
	require.NoError(t, err)
	require.NoError(t, d.Map(p, 2*fakePage))

	ctl.failMallocIn(3)
	err = d.Map(p.Add(4*fakePage), 6*fakePage)
	assert.ErrorIs(t, err, device.ErrOutOfMemory)
	assert.ErrorContains(t, err, "aclrtMallocPhysical: ACL_ERROR_RT_MEMORY_ALLOCATION (207001)")
	assert.EqualValues(t, 2, ctl.liveHandles(), "nothing left of the failed Map")

	ctl.failMapIn(2, int32(ErrorRTInternal))
	err = d.Map(p.Add(4*fakePage), 6*fakePage)
	assert.ErrorContains(t, err, "aclrtMapMem: ACL_ERROR_RT_INTERNAL_ERROR (507000)")
	assert.EqualValues(t, 2, ctl.liveHandles(), "nothing left of the failed Map")
	assert.EqualValues(t, 2*fakePage, ctl.used())

	require.NoError(t, d.Map(p.Add(4*fakePage), 6*fakePage))
	buf := make([]byte, fakePage)
	assert.Error(t, d.WriteDevice(p.Add(2*fakePage), buf), "an unmapped page faults")
	require.NoError(t, d.WriteDevice(p.Add(4*fakePage), buf))
	require.NoError(t, d.ReleaseAddress(p))
	assert.Zero(t, ctl.liveHandles())
}

func TestMappingFallback(t *testing.T) {
	for _, tt := range []struct {
		name    string
		variant string
		flags   []string
		opts    []Option
		want    string
	}{
		{"no virtual memory calls", "novmm", []string{"-DOMIT_VMM"}, nil, "aclrtMemGetAllocationGranularity"},
		{"turned off", "default", nil, []Option{WithoutMapping()}, "WithoutMapping"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := buildFake(t, tt.variant, tt.flags...)
			openFake(t, path)
			var d *Device
			var err error
			require.NotPanics(t, func() { d, err = New(append([]Option{WithLibrary(path)}, tt.opts...)...) })
			require.NoError(t, err)
			defer d.Close()
			assert.Zero(t, d.PageSize())
			assert.ErrorContains(t, d.Mapping(), tt.want)
			assert.ErrorIs(t, d.Map(0, fakePage), device.ErrNotSupported)
			a := device.NewAllocator(d)
			defer a.Close()
			assert.ErrorIs(t, a.ReserveMapped(1<<20), device.ErrNotSupported)
		})
	}
}
