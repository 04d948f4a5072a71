package host_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/host"
)

// TestLaunchFIFOWithCopies checks that a launched function runs after the
// copy queued before it on the same stream and before the copy queued
// after it, and that Bytes is the device memory itself.
func TestLaunchFIFOWithCopies(t *testing.T) {
	d, err := host.New(1<<20, host.WithBandwidth(1e9, 1e9))
	require.NoError(t, err)
	defer d.Close()
	s, err := d.NewStream()
	require.NoError(t, err)
	p, err := d.Alloc(4096)
	require.NoError(t, err)
	in, err := d.AllocHost(4096)
	require.NoError(t, err)
	out, err := d.AllocHost(4096)
	require.NoError(t, err)
	for i := range in.Bytes() {
		in.Bytes()[i] = byte(i)
	}
	mem := d.Bytes(p, 4096)
	require.Len(t, mem, 4096)
	require.NoError(t, d.CopyH2D(p, in, s))
	require.NoError(t, d.Launch(s, func() {
		for i := range mem {
			mem[i] = mem[i]*2 + 1
		}
	}))
	require.NoError(t, d.CopyD2H(out, p, s))
	require.NoError(t, d.SyncStream(s))
	for i, b := range out.Bytes() {
		require.Equal(t, byte(i)*2+1, b, "byte %d", i)
	}
	got := make([]byte, 16)
	require.NoError(t, d.ReadDevice(got, p.Add(100)))
	assert.Equal(t, mem[100:116], got, "Bytes aliases device memory")
}

// TestLaunchWaitsForEvent checks that a function launched after a
// StreamWait runs only once the other stream's copy has completed: the
// ordering the Engine relies on for swapped-in tensors.
func TestLaunchWaitsForEvent(t *testing.T) {
	release := make(chan struct{})
	d, err := host.New(1<<20, host.WithBandwidth(1, 1), host.WithSleep(func(time.Duration) { <-release }))
	require.NoError(t, err)
	defer d.Close()
	copyStream, err := d.NewStream()
	require.NoError(t, err)
	p, err := d.Alloc(64)
	require.NoError(t, err)
	src, err := d.AllocHost(64)
	require.NoError(t, err)
	src.Bytes()[0] = 42
	ev, err := d.NewEvent()
	require.NoError(t, err)

	require.NoError(t, d.CopyH2D(p, src, copyStream)) // stuck until release
	require.NoError(t, d.Record(ev, copyStream))
	require.NoError(t, d.StreamWait(0, ev))
	mem := d.Bytes(p, 64)
	var ran atomic.Bool
	var seen atomic.Int32
	require.NoError(t, d.Launch(0, func() {
		seen.Store(int32(mem[0]))
		ran.Store(true)
	}))
	after, err := d.NewEvent()
	require.NoError(t, err)
	require.NoError(t, d.Record(after, 0))

	time.Sleep(10 * time.Millisecond)
	assert.False(t, ran.Load(), "the function ran before the copy it waits on")
	done, err := d.Query(after)
	require.NoError(t, err)
	assert.False(t, done, "a record after the launch captures it")

	close(release)
	require.NoError(t, d.SyncEvent(after))
	assert.True(t, ran.Load())
	assert.Equal(t, int32(42), seen.Load(), "the function saw the copied byte")
}

func TestLaunchErrors(t *testing.T) {
	d, err := host.New(1 << 20)
	require.NoError(t, err)
	p, err := d.Alloc(100)
	require.NoError(t, err)

	assert.ErrorIs(t, d.Launch(0, nil), device.ErrInvalidValue)
	assert.ErrorIs(t, d.Launch(99, func() {}), device.ErrInvalidValue, "unknown stream")
	assert.Nil(t, d.Bytes(p, 101), "past the allocation")
	assert.Nil(t, d.Bytes(p-1, 1), "before the first allocation")
	assert.Len(t, d.Bytes(p.Add(50), 50), 50, "a sub-range")

	require.NoError(t, d.Close())
	assert.ErrorIs(t, d.Launch(0, func() {}), device.ErrClosed)
	assert.Nil(t, d.Bytes(p, 1))
}
