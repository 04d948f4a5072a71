package ascend

import (
	"errors"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/devicetest"
)

func TestConformanceFake(t *testing.T) {
	devicetest.Run(t, func(t *testing.T) device.Device {
		d, _ := newFake(t)
		return d
	})
}

func TestErrorMapping(t *testing.T) {
	d, ctl := newFake(t)
	defer d.Close()

	ctl.failAllocIn(0)
	_, err := d.Alloc(1 << 20)
	require.Error(t, err)
	assert.ErrorIs(t, err, device.ErrOutOfMemory)
	var ae Error
	require.True(t, errors.As(err, &ae))
	assert.Equal(t, ErrorRTMemoryAllocation, ae)
	assert.Contains(t, err.Error(), "aclrtMalloc")
	assert.Contains(t, err.Error(), "ACL_ERROR_RT_MEMORY_ALLOCATION (207001)")

	_, total, err := d.MemInfo()
	require.NoError(t, err)
	_, err = d.Alloc(total + 1)
	assert.ErrorIs(t, err, device.ErrOutOfMemory, "real out of memory from the library")

	p, err := d.Alloc(4096)
	require.NoError(t, err)
	defer d.Free(p)
	src, err := d.AllocHost(4096)
	require.NoError(t, err)
	defer d.FreeHost(src)
	tests := []struct {
		code             int32
		wantOOM, wantInv bool
		wantName         string
	}{
		{code: 107000, wantInv: true, wantName: "ACL_ERROR_RT_PARAM_INVALID"},
		{code: 100000, wantInv: true, wantName: "ACL_ERROR_INVALID_PARAM"},
		{code: 207001, wantOOM: true, wantName: "ACL_ERROR_RT_MEMORY_ALLOCATION"},
		{code: 507000, wantName: "ACL_ERROR_RT_INTERNAL_ERROR"},
		{code: 123456, wantName: "aclError(123456)"},
	}
	for _, tt := range tests {
		ctl.failNextCopy(tt.code)
		err := d.CopyH2D(p, src, 0)
		require.Error(t, err, "code %d", tt.code)
		assert.Equal(t, tt.wantOOM, errors.Is(err, device.ErrOutOfMemory), "code %d", tt.code)
		assert.Equal(t, tt.wantInv, errors.Is(err, device.ErrInvalidValue), "code %d", tt.code)
		assert.Contains(t, err.Error(), "aclrtMemcpyAsync")
		assert.Contains(t, err.Error(), tt.wantName)
	}
}

func TestArgumentPassing(t *testing.T) {
	d, ctl := newFake(t)
	defer d.Close()
	assert.Equal(t, "FakeAscend910B (npu:0)", d.Name())
	s, err := d.NewStream()
	require.NoError(t, err)
	p, err := d.Alloc(1 << 16)
	require.NoError(t, err)
	assert.EqualValues(t, memMallocHugeFirst, ctl.last(lastPolicy))
	h, err := d.AllocHost(4096)
	require.NoError(t, err)

	tests := []struct {
		name  string
		run   func() error
		kind  int64
		count int64
	}{
		{"h2d", func() error { return d.CopyH2D(p.Add(64), h.Slice(1, 1000), s) }, memcpyHostToDevice, 1000},
		{"d2h", func() error { return d.CopyD2H(h.Slice(0, 777), p, s) }, memcpyDeviceToHost, 777},
		{"d2d", func() error { return d.CopyD2D(p.Add(8192), p, 4000, s) }, memcpyDeviceToDevice, 4000},
	}
	for _, tt := range tests {
		require.NoError(t, tt.run(), tt.name)
		assert.Equal(t, tt.kind, ctl.last(lastKind), tt.name)
		assert.Equal(t, tt.count, ctl.last(lastCount), tt.name)
		assert.Equal(t, tt.count, ctl.last(lastDestMax), "destMax "+tt.name)
		assert.EqualValues(t, s, ctl.last(lastStream), tt.name)
	}
	ctl.setTotal(1 << 30)
	free, total, err := d.MemInfo()
	require.NoError(t, err)
	assert.EqualValues(t, hbmMem, ctl.last(lastMemAttr))
	assert.EqualValues(t, 1<<30, total)
	assert.EqualValues(t, 1<<30-1<<16, free)
	require.NoError(t, d.Free(p))
	require.NoError(t, d.FreeHost(h))
	require.NoError(t, d.DestroyStream(s))
}

// TestContextPerThread runs calls on fresh OS threads that have no AscendCL
// context, as goroutines do once the scheduler moves them.
func TestContextPerThread(t *testing.T) {
	d, ctl := newFake(t)
	defer d.Close()
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			ctl.clearContext()
			p, err := d.Alloc(4096)
			if err == nil {
				err = d.Free(p)
			}
			errs <- err
		}()
	}
	for range 8 {
		assert.NoError(t, <-errs)
	}
}

func TestEventStatus(t *testing.T) {
	d, ctl := newFake(t)
	defer d.Close()
	ev, err := d.NewEvent()
	require.NoError(t, err)
	done, err := d.Query(ev)
	require.NoError(t, err)
	assert.True(t, done, "never recorded counts as complete although AscendCL says not ready")
	require.NoError(t, d.StreamWait(0, ev))
	assert.Zero(t, ctl.last(lastWaits), "no device wait on a never-recorded event")

	require.NoError(t, d.Record(ev, 0))
	ctl.queryNotReady(1)
	done, err = d.Query(ev)
	require.NoError(t, err)
	assert.False(t, done)
	done, err = d.Query(ev)
	require.NoError(t, err)
	assert.True(t, done)
	require.NoError(t, d.StreamWait(0, ev))
	assert.EqualValues(t, 1, ctl.last(lastWaits))
}

func TestInitFinalize(t *testing.T) {
	d1, ctl := newFake(t)
	d2, err := New(WithLibrary(d1.Library()), WithDevice(1))
	require.NoError(t, err)
	assert.Equal(t, "FakeAscend910B (npu:1)", d2.Name())
	assert.EqualValues(t, 1, ctl.initialized())
	require.NoError(t, d1.Close())
	assert.EqualValues(t, 1, ctl.initialized(), "still in use by the second device")
	require.NoError(t, d2.Close())
	assert.EqualValues(t, 0, ctl.initialized(), "finalized with the last device")
	require.NoError(t, d2.Close())

	_, err = New(WithLibrary(d1.Library()), WithDevice(7))
	assert.ErrorIs(t, err, device.ErrInvalidValue)
	assert.EqualValues(t, 0, ctl.initialized(), "a failed New does not leave AscendCL initialized")
}

func TestMissingSymbol(t *testing.T) {
	path := buildFake(t, "noquery", "-DOMIT_QUERY")
	var err error
	require.NotPanics(t, func() { _, err = New(WithLibrary(path)) })
	require.Error(t, err)
	assert.Contains(t, err.Error(), "aclrtQueryEventStatus")
}

func TestLookupOrder(t *testing.T) {
	a := buildFake(t, "a", `-DFAKE_SOC="SocA"`)
	b := buildFake(t, "b", `-DFAKE_SOC="SocB"`)
	home := filepath.Dir(filepath.Dir(b))

	assert.Equal(t, []string{"/x.so", "/home/lib64/libascendcl.so", toolkitPath, "libascendcl.so"},
		candidates("/x.so", "/home"))

	t.Setenv(EnvHome, home)
	for _, tt := range []struct {
		name string
		opts []Option
		want string
	}{
		{"option first", []Option{WithLibrary(a)}, "SocA (npu:0)"},
		{"ASCEND_HOME_PATH next", nil, "SocB (npu:0)"},
		{"failing option falls through", []Option{WithLibrary("/nonexistent/libascendcl.so")}, "SocB (npu:0)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d, err := New(tt.opts...)
			require.NoError(t, err)
			defer d.Close()
			assert.Equal(t, tt.want, d.Name())
		})
	}

	t.Run("not found", func(t *testing.T) {
		t.Setenv(EnvHome, "/nonexistent/home")
		d, err := New(WithLibrary("/nonexistent/opt/libascendcl.so"))
		if err == nil {
			d.Close()
			t.Skipf("AscendCL is installed (%s)", d.Library())
		}
		assert.ErrorIs(t, err, device.ErrLibraryNotFound)
		for _, p := range candidates("/nonexistent/opt/libascendcl.so", "/nonexistent/home") {
			assert.Contains(t, err.Error(), p)
		}
		assert.True(t, strings.HasPrefix(err.Error(), "ascend: "))
	})
}
