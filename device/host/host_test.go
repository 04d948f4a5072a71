package host_test

import (
	"bytes"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/devicetest"
	"github.com/chameleon-go/chameleon/device/host"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestConformance runs the suite with a slow link (D2H slower than H2D), so
// that missing FIFO order or a missing event wait changes the bytes seen.
func TestConformance(t *testing.T) {
	devicetest.Run(t, func(t *testing.T) device.Device {
		d, err := host.New(256<<20, host.WithBandwidth(8e9, 2e9))
		require.NoError(t, err)
		return d
	})
}

// TestMapperConformance runs the Mapper suite on 64 KiB pages.
func TestMapperConformance(t *testing.T) {
	devicetest.RunMapper(t, func(t *testing.T) device.Device {
		d, err := host.New(64*64<<10, host.WithPageSize(64<<10))
		require.NoError(t, err)
		return d
	})
}

func TestLinkModel(t *testing.T) {
	var mu sync.Mutex
	var slept []time.Duration
	d, err := host.New(64<<20,
		host.WithBandwidth(1e9, 0.5e9),
		host.WithSleep(func(d time.Duration) {
			mu.Lock()
			slept = append(slept, d)
			mu.Unlock()
		}))
	require.NoError(t, err)
	defer d.Close()
	p, err := d.Alloc(1 << 20)
	require.NoError(t, err)
	h, err := d.AllocHost(1 << 20)
	require.NoError(t, err)
	require.NoError(t, d.CopyH2D(p, h, 0))
	require.NoError(t, d.CopyD2H(h, p, 0))
	require.NoError(t, d.CopyD2D(p, p, 1<<20, 0))
	require.NoError(t, d.SyncStream(0))
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []time.Duration{1048576 * time.Microsecond / 1000, 2097152 * time.Microsecond / 1000}, slept,
		"1 MiB at 1 GB/s and at 0.5 GB/s; device-to-device copies do not use the link")
}

// TestLinkShared checks that two streams copying the same way share the
// link: with real sleeps, two 2 ms copies take about 4 ms, not 2.
func TestLinkShared(t *testing.T) {
	d, err := host.New(64<<20, host.WithBandwidth(1e9, 1e9))
	require.NoError(t, err)
	defer d.Close()
	s1, _ := d.NewStream()
	s2, _ := d.NewStream()
	p, _ := d.Alloc(4 << 20)
	h1, _ := d.AllocHost(2e6)
	h2, _ := d.AllocHost(2e6)
	start := time.Now()
	require.NoError(t, d.CopyH2D(p, h1, s1))
	require.NoError(t, d.CopyH2D(p.Add(2e6), h2, s2))
	require.NoError(t, d.SyncStream(s1))
	require.NoError(t, d.SyncStream(s2))
	assert.GreaterOrEqual(t, time.Since(start), 4*time.Millisecond)
}

func TestQueueDoesNotBlock(t *testing.T) {
	release := make(chan struct{})
	d, err := host.New(64<<20, host.WithBandwidth(1, 1), host.WithSleep(func(time.Duration) { <-release }))
	require.NoError(t, err)
	p, _ := d.Alloc(4096)
	h, _ := d.AllocHost(4096)
	ev, _ := d.NewEvent()
	s, _ := d.NewStream()
	require.NoError(t, d.CopyH2D(p, h, 0))
	require.NoError(t, d.Record(ev, 0))
	require.NoError(t, d.StreamWait(s, ev)) // returns although the copy is stuck
	done, err := d.Query(ev)
	require.NoError(t, err)
	assert.False(t, done, "the copy before the record has not run")
	close(release)
	require.NoError(t, d.SyncStream(s))
	done, err = d.Query(ev)
	require.NoError(t, err)
	assert.True(t, done)
	require.NoError(t, d.Close())
}

func TestPeakAndClose(t *testing.T) {
	d, err := host.New(10 << 20)
	require.NoError(t, err)
	a, err := d.Alloc(4 << 20)
	require.NoError(t, err)
	b, err := d.Alloc(4 << 20)
	require.NoError(t, err)
	_, err = d.Alloc(4 << 20)
	assert.ErrorIs(t, err, device.ErrOutOfMemory)
	require.NoError(t, d.Free(a))
	require.NoError(t, d.Free(b))
	assert.Equal(t, int64(8<<20), d.PeakAllocated())
	assert.Zero(t, d.Allocated())
	err = d.CopyD2D(b, b, 1, 0)
	assert.ErrorIs(t, err, device.ErrInvalidValue, "freed memory is gone")
	assert.ErrorIs(t, d.DestroyStream(0), device.ErrInvalidValue, "the default stream stays")

	require.NoError(t, d.Close())
	require.NoError(t, d.Close())
	_, err = d.Alloc(1)
	assert.ErrorIs(t, err, device.ErrClosed)
	assert.ErrorIs(t, d.SyncStream(0), device.ErrClosed)
	_, err = d.Query(1)
	assert.ErrorIs(t, err, device.ErrClosed)
}

// Sizes beyond the capacity, or beyond what the machine can allocate, are
// errors: never a panic in make, never the runtime's fatal out of memory.
func TestSizesBeyondCapacityOrMachine(t *testing.T) {
	const huge = 1 << 47 // 128 TiB: more than any machine running this test
	tests := []struct {
		name     string
		capacity int64
		opts     []host.Option
		held     int64 // allocated first
		size     int64
		dev      bool // Alloc, else AllocHost
		want     error
	}{
		{name: "device above capacity", capacity: 1 << 20, size: 1<<20 + 1, dev: true, want: device.ErrOutOfMemory},
		{name: "device above what is left", capacity: 1 << 20, held: 1 << 19, size: 1<<19 + 1, dev: true, want: device.ErrOutOfMemory},
		{name: "device sum overflows", capacity: math.MaxInt64, held: 16, size: math.MaxInt64, dev: true, want: device.ErrOutOfMemory},
		{name: "device above the machine", capacity: math.MaxInt64, size: huge, dev: true, want: device.ErrOutOfMemory},
		{name: "device above make's limit", capacity: math.MaxInt64, size: math.MaxInt64 / 2, dev: true, want: device.ErrOutOfMemory},
		{name: "device negative", capacity: 1 << 20, size: -1, dev: true, want: device.ErrInvalidValue},
		{name: "host above the machine", capacity: 1 << 20, size: huge, want: device.ErrOutOfMemory},
		{name: "host sum overflows", capacity: 1 << 20, opts: []host.Option{host.WithHostCapacity(math.MaxInt64)}, size: math.MaxInt64, want: device.ErrOutOfMemory},
		{name: "host negative", capacity: 1 << 20, size: math.MinInt64, want: device.ErrInvalidValue},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := host.New(tt.capacity, tt.opts...)
			require.NoError(t, err)
			defer d.Close()
			if tt.held > 0 {
				_, err := d.Alloc(tt.held)
				require.NoError(t, err)
			}
			if tt.dev {
				_, err = d.Alloc(tt.size)
			} else {
				_, err = d.AllocHost(tt.size)
			}
			require.ErrorIs(t, err, tt.want)
			assert.Contains(t, err.Error(), fmt.Sprint(tt.size))
			assert.Equal(t, tt.held, d.Allocated())
		})
	}
}

func TestMapper(t *testing.T) {
	const page = 4 << 10
	d, err := host.New(4*page, host.WithPageSize(page))
	require.NoError(t, err)
	defer d.Close()
	assert.Equal(t, int64(page), d.PageSize())

	_, err = d.ReserveAddress(page + 1)
	assert.ErrorIs(t, err, device.ErrInvalidValue, "whole pages")
	p, err := d.ReserveAddress(16 * page)
	require.NoError(t, err)
	assert.Zero(t, d.Allocated(), "address space costs no memory")

	buf := make([]byte, 2*page)
	assert.ErrorIs(t, d.ReadDevice(buf, p), device.ErrInvalidValue, "nothing mapped")
	require.NoError(t, d.Map(p.Add(page), 2*page))
	assert.Equal(t, int64(2*page), d.Allocated())
	assert.ErrorIs(t, d.Map(p.Add(2*page), page), device.ErrInvalidValue, "mapped twice")
	assert.ErrorIs(t, d.Map(p.Add(8*page), 3*page), device.ErrOutOfMemory, "over the capacity")
	assert.ErrorIs(t, d.Map(p.Add(1), page), device.ErrInvalidValue, "not page aligned")

	data := bytes.Repeat([]byte{7}, 2*page)
	require.NoError(t, d.WriteDevice(p.Add(page), data))
	require.NoError(t, d.ReadDevice(buf, p.Add(page)))
	assert.Equal(t, data, buf)
	assert.ErrorIs(t, d.Free(p), device.ErrInvalidValue, "a reservation is not an allocation")

	require.NoError(t, d.Unmap(p.Add(2*page), page))
	assert.ErrorIs(t, d.ReadDevice(buf, p.Add(page)), device.ErrInvalidValue, "a page of the range is unmapped")
	assert.ErrorIs(t, d.Unmap(p.Add(2*page), page), device.ErrInvalidValue, "unmapped twice")
	require.NoError(t, d.Map(p.Add(2*page), page))
	require.NoError(t, d.ReadDevice(buf[:page], p.Add(2*page)))
	assert.Equal(t, make([]byte, page), buf[:page], "a page mapped again reads zeros")

	require.NoError(t, d.ReleaseAddress(p))
	assert.Zero(t, d.Allocated())
	assert.ErrorIs(t, d.ReleaseAddress(p), device.ErrInvalidValue)
}

// TestWithoutMapping: with mapping off the device says it has no pages, so
// an allocator on it cannot reserve mapped memory (the Engine then reserves
// a plain segment), and reserving address space fails.
func TestWithoutMapping(t *testing.T) {
	const limit = 1 << 20
	d, err := host.New(limit, host.WithPageSize(64<<10), host.WithoutMapping())
	require.NoError(t, err)
	defer d.Close()
	assert.Zero(t, d.PageSize())
	_, err = d.ReserveAddress(64 << 10)
	assert.ErrorIs(t, err, device.ErrInvalidValue)
	a := device.NewAllocator(d)
	defer a.Close()
	require.ErrorIs(t, a.ReserveMapped(limit), device.ErrNotSupported)
	require.NoError(t, a.Reserve(limit), "a plain segment instead")
	p, err := a.Alloc(limit/2, 0)
	require.NoError(t, err)
	assert.Equal(t, int64(limit), d.Allocated(), "the whole segment at once")
	assert.Zero(t, a.Stats().PageSize)
	require.NoError(t, a.Free(p))
}
