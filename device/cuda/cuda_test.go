package cuda

import (
	"errors"
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
	var ce Error
	require.True(t, errors.As(err, &ce))
	assert.Equal(t, ErrorMemoryAllocation, ce)
	assert.Contains(t, err.Error(), "cudaMalloc")
	assert.Contains(t, err.Error(), "cudaErrorMemoryAllocation (2)")

	// The next allocation succeeds: the failure was injected once.
	p, err := d.Alloc(1 << 20)
	require.NoError(t, err)
	defer d.Free(p)

	// OOM surfaces through the allocator's growth path too.
	a := device.NewAllocator(d, device.WithGrowth(1<<20))
	defer a.Close()
	ctl.failAllocIn(0)
	_, err = a.Alloc(4096, 0)
	assert.ErrorIs(t, err, device.ErrOutOfMemory)

	src, err := d.AllocHost(4096)
	require.NoError(t, err)
	defer d.FreeHost(src)
	tests := []struct {
		code             int32
		wantOOM, wantInv bool
		wantName         string
	}{
		{code: 1, wantInv: true, wantName: "cudaErrorInvalidValue"},
		{code: 2, wantOOM: true, wantName: "cudaErrorMemoryAllocation"},
		{code: 400, wantInv: true, wantName: "cudaErrorInvalidResourceHandle"},
		{code: 999, wantName: "cudaErrorUnknown"},
	}
	for _, tt := range tests {
		ctl.failNextCopy(tt.code)
		err := d.CopyH2D(p, src, 0)
		require.Error(t, err, "code %d", tt.code)
		assert.Equal(t, tt.wantOOM, errors.Is(err, device.ErrOutOfMemory), "code %d", tt.code)
		assert.Equal(t, tt.wantInv, errors.Is(err, device.ErrInvalidValue), "code %d", tt.code)
		assert.Contains(t, err.Error(), "cudaMemcpyAsync")
		assert.Contains(t, err.Error(), tt.wantName)
	}
}

func TestErrorNames(t *testing.T) {
	assert.Equal(t, "cudaErrorMemoryAllocation", errorName(2, nil))
	assert.Equal(t, "cudaError(12345)", errorName(12345, nil))
	lib := func(code int32) string {
		if code == 222 {
			return "cudaErrorUnsupportedPtxVersion"
		}
		return "unrecognized error code"
	}
	assert.Equal(t, "cudaErrorUnsupportedPtxVersion", errorName(222, &lib))
	assert.Equal(t, "cudaErrorIllegalAddress", errorName(700, &lib), "table fills in what the runtime does not know")

	// Loaded through purego: the fake knows 222, the table does not.
	d, _ := newFake(t)
	defer d.Close()
	assert.Equal(t, "cudaErrorUnsupportedPtxVersion (222)", Error(222).Error())
	assert.True(t, errors.Is(Error(2), device.ErrOutOfMemory))
	assert.False(t, errors.Is(Error(600), device.ErrOutOfMemory))
}

func TestArgumentPassing(t *testing.T) {
	d, ctl := newFake(t)
	defer d.Close()
	s, err := d.NewStream()
	require.NoError(t, err)
	assert.EqualValues(t, streamNonBlocking, ctl.last(lastStreamFlags))
	ev, err := d.NewEvent()
	require.NoError(t, err)
	assert.EqualValues(t, eventDisableTiming, ctl.last(lastEventFlags))
	h, err := d.AllocHost(12345)
	require.NoError(t, err)
	assert.EqualValues(t, 12345, h.Len())
	assert.EqualValues(t, hostAllocDefault, ctl.last(lastHostFlags))
	p, err := d.Alloc(1 << 16)
	require.NoError(t, err)

	tests := []struct {
		name  string
		run   func() error
		kind  int64
		count int64
	}{
		{"h2d", func() error { return d.CopyH2D(p.Add(8), h.Slice(3, 1000), s) }, memcpyHostToDevice, 1000},
		{"d2h", func() error { return d.CopyD2H(h.Slice(0, 777), p, s) }, memcpyDeviceToHost, 777},
		{"d2d", func() error { return d.CopyD2D(p.Add(4096), p, 4000, s) }, memcpyDeviceToDevice, 4000},
	}
	for _, tt := range tests {
		before := ctl.last(lastAsyncCopies)
		require.NoError(t, tt.run(), tt.name)
		assert.Equal(t, before+1, ctl.last(lastAsyncCopies), tt.name)
		assert.Equal(t, tt.kind, ctl.last(lastKind), tt.name)
		assert.Equal(t, tt.count, ctl.last(lastCount), tt.name)
		assert.EqualValues(t, s, ctl.last(lastStream), tt.name)
	}

	require.NoError(t, d.Record(ev, s))
	assert.EqualValues(t, 1, ctl.last(lastRecords))
	require.NoError(t, d.StreamWait(0, ev))
	assert.EqualValues(t, 1, ctl.last(lastWaits))
	assert.EqualValues(t, 0, ctl.last(lastWaitFlags))

	syncs := ctl.last(lastDeviceSyncs)
	buf := make([]byte, 64)
	require.NoError(t, d.ReadDevice(buf, p))
	assert.Equal(t, syncs+1, ctl.last(lastDeviceSyncs), "ReadDevice synchronizes the device first")
	assert.EqualValues(t, memcpyDeviceToHost, ctl.last(lastKind))
	require.NoError(t, d.WriteDevice(p, buf))
	assert.EqualValues(t, memcpyHostToDevice, ctl.last(lastKind))

	ctl.setTotal(1 << 30)
	free, total, err := d.MemInfo()
	require.NoError(t, err)
	assert.EqualValues(t, 1<<30, total)
	assert.EqualValues(t, 1<<30-1<<16, free)

	require.NoError(t, d.Free(p))
	require.NoError(t, d.FreeHost(h))
	assert.Zero(t, ctl.liveAllocs())
	require.NoError(t, d.DestroyStream(s))
	assert.ErrorIs(t, d.DestroyStream(s), device.ErrInvalidValue, "second destroy")
	require.NoError(t, d.DestroyEvent(ev))
}

func TestQueryNotReady(t *testing.T) {
	d, ctl := newFake(t)
	defer d.Close()
	ev, err := d.NewEvent()
	require.NoError(t, err)
	require.NoError(t, d.Record(ev, 0))
	ctl.queryNotReady(2)
	for i, want := range []bool{false, false, true} {
		done, err := d.Query(ev)
		require.NoError(t, err, "query %d", i)
		assert.Equal(t, want, done, "query %d", i)
	}
}

func TestMissingSymbol(t *testing.T) {
	path := buildFake(t, "noquery", "-DOMIT_EVENT_QUERY")
	var d *Device
	var err error
	require.NotPanics(t, func() { d, err = New(WithLibrary(path)) })
	require.Error(t, err)
	assert.Nil(t, d)
	assert.Contains(t, err.Error(), "cudaEventQuery")
	assert.Contains(t, err.Error(), path)

	// Optional symbols may be missing.
	path = buildFake(t, "noname", "-DOMIT_ERROR_NAME")
	d, err = New(WithLibrary(path))
	require.NoError(t, err)
	require.NoError(t, d.Close())
}

func TestLookupOrder(t *testing.T) {
	a := buildFake(t, "a", `-DFAKE_NAME="Fake A"`)
	b := buildFake(t, "b", `-DFAKE_NAME="Fake B"`)

	assert.Equal(t, append([]string{"/opt.so", "/env.so"}, defaultPaths...), candidates("/opt.so", "/env.so"))
	assert.Equal(t, defaultPaths, candidates("", ""))

	t.Setenv(EnvLibrary, b)
	tests := []struct {
		name string
		opts []Option
		want string
	}{
		{"option beats environment", []Option{WithLibrary(a)}, "Fake A (cuda:0)"},
		{"environment without option", nil, "Fake B (cuda:0)"},
		{"failing option falls through to environment", []Option{WithLibrary("/nonexistent/libcudart-opt.so")}, "Fake B (cuda:0)"},
		{"device ordinal in name", []Option{WithLibrary(a), WithDevice(1)}, "Fake A (cuda:1)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := New(tt.opts...)
			require.NoError(t, err)
			defer d.Close()
			assert.Equal(t, tt.want, d.Name())
		})
	}

	t.Run("not found names every place tried", func(t *testing.T) {
		t.Setenv(EnvLibrary, "/nonexistent/libcudart-env.so")
		d, err := New(WithLibrary("/nonexistent/libcudart-opt.so"))
		if err == nil {
			d.Close()
			t.Skipf("a CUDA runtime is installed (%s); cannot observe the not-found error", d.Library())
		}
		assert.ErrorIs(t, err, device.ErrLibraryNotFound)
		for _, p := range candidates("/nonexistent/libcudart-opt.so", "/nonexistent/libcudart-env.so") {
			assert.Contains(t, err.Error(), p)
		}
		assert.Less(t, strings.Index(err.Error(), "libcudart-opt.so"), strings.Index(err.Error(), "libcudart-env.so"))
		assert.Contains(t, err.Error(), "CHAMELEON_CUDART=/nonexistent/libcudart-env.so did not load either", "says which variable points at the library")
	})

	t.Run("not found says which variable to set", func(t *testing.T) {
		t.Setenv(EnvLibrary, "")
		d, err := New(WithLibrary("/nonexistent/libcudart-opt.so"))
		if err == nil {
			d.Close()
			t.Skipf("a CUDA runtime is installed (%s); cannot observe the not-found error", d.Library())
		}
		assert.ErrorIs(t, err, device.ErrLibraryNotFound)
		assert.Contains(t, err.Error(), "set CHAMELEON_CUDART to the path of libcudart")
	})
}

func TestDeviceOrdinal(t *testing.T) {
	d, ctl := newFake(t, WithDevice(1))
	defer d.Close()
	ctl.reset()
	p, err := d.Alloc(4096)
	require.NoError(t, err)
	assert.EqualValues(t, 1, ctl.last(lastDevice), "calls run with device 1 current")
	require.NoError(t, d.Free(p))

	_, err = New(WithLibrary(buildFake(t, "default")), WithDevice(5))
	assert.ErrorIs(t, err, device.ErrInvalidValue)
}

func TestClosed(t *testing.T) {
	d, _ := newFake(t)
	s, err := d.NewStream()
	require.NoError(t, err)
	_, err = d.NewEvent()
	require.NoError(t, err)
	require.NoError(t, d.Close())
	require.NoError(t, d.Close())
	_, err = d.Alloc(1)
	assert.ErrorIs(t, err, device.ErrClosed)
	assert.ErrorIs(t, d.SyncStream(s), device.ErrClosed)
	_, err = d.Query(1)
	assert.ErrorIs(t, err, device.ErrClosed)
}

func TestWithStream(t *testing.T) {
	d, ctl := newFake(t)
	s, err := d.NewStream()
	require.NoError(t, err)
	d2, err := New(WithLibrary(d.Library()), WithStream(s))
	require.NoError(t, err)
	assert.Equal(t, s, d2.DefaultStream())
	p, err := d2.Alloc(64)
	require.NoError(t, err)
	require.NoError(t, d2.CopyD2D(p, p, 64, d2.DefaultStream()))
	assert.EqualValues(t, s, ctl.last(lastStream))
	require.NoError(t, d2.Free(p))
	require.NoError(t, d2.Close())
	require.NoError(t, d.Close())
}
