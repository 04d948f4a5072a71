package host_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/host"
)

// TestModeledClock checks the streams' modeled clock that timing events
// read: LaunchFor costs add up on a stream whatever the host does between
// calls, a copy takes its time on the link model, a wait moves the waiting
// stream to the time of the work it waited for, and an idle stream's
// record reads the stream's clock.
func TestModeledClock(t *testing.T) {
	// 1 MiB at 1 GB/s each way: 1048576 ns; no real sleeping.
	d, err := host.New(64<<20, host.WithBandwidth(1e9, 1e9), host.WithSleep(func(time.Duration) {}))
	require.NoError(t, err)
	defer d.Close()
	ev := func() device.Event {
		e, err := d.NewTimingEvent()
		require.NoError(t, err)
		return e
	}
	elapsed := func(a, b device.Event) time.Duration {
		t.Helper()
		v, err := d.Elapsed(a, b)
		require.NoError(t, err)
		return v
	}
	c := d.DefaultStream()
	s, err := d.NewStream()
	require.NoError(t, err)
	t0, t1, t2, t3, t4 := ev(), ev(), ev(), ev(), ev()

	require.NoError(t, d.Record(t0, c)) // idle: reads the clock, 0
	ran := false
	require.NoError(t, d.LaunchFor(c, 3*time.Millisecond, func() { ran = true }))
	require.NoError(t, d.LaunchFor(c, 2*time.Millisecond, nil))
	time.Sleep(time.Millisecond) // host time does not count
	require.NoError(t, d.Record(t1, c))
	require.NoError(t, d.SyncEvent(t1))
	assert.True(t, ran)
	assert.Equal(t, 5*time.Millisecond, elapsed(t0, t1), "two kernels of 3 and 2 ms")

	// The copy stream waits for compute (at 5 ms), then copies 1 MiB.
	p, err := d.Alloc(1 << 20)
	require.NoError(t, err)
	h, err := d.AllocHost(1 << 20)
	require.NoError(t, err)
	require.NoError(t, d.StreamWait(s, t1))
	require.NoError(t, d.Record(t2, s))
	require.NoError(t, d.CopyH2D(p, h, s))
	require.NoError(t, d.Record(t3, s))
	require.NoError(t, d.SyncStream(s))
	assert.Equal(t, 5*time.Millisecond, elapsed(t0, t2), "the wait moved the copy stream to compute's time")
	assert.Equal(t, 1048576*time.Nanosecond, elapsed(t2, t3), "1 MiB at 1 GB/s")

	// An idle stream recorded again reads where it stands.
	require.NoError(t, d.Record(t4, c))
	assert.Equal(t, 5*time.Millisecond, elapsed(t0, t4))
	assert.Equal(t, -5*time.Millisecond, elapsed(t4, t0))

	// Refusals: not ready, negative cost.
	block := make(chan struct{})
	require.NoError(t, d.Launch(c, func() { <-block }))
	require.NoError(t, d.Record(t4, c))
	_, err = d.Elapsed(t0, t4)
	assert.ErrorIs(t, err, device.ErrNotReady)
	close(block)
	require.NoError(t, d.SyncEvent(t4))
	assert.ErrorIs(t, d.LaunchFor(c, -time.Second, nil), device.ErrInvalidValue)
	assert.ErrorIs(t, func() error { _, err := d.Elapsed(t0, 999); return err }(), device.ErrInvalidValue)
}

// TestModeledLinkTurns checks that two copy streams the same way take turns
// on the link in modeled time too, while the two directions run at once.
func TestModeledLinkTurns(t *testing.T) {
	d, err := host.New(64<<20, host.WithBandwidth(1e9, 1e9), host.WithSleep(func(time.Duration) {}))
	require.NoError(t, err)
	defer d.Close()
	var evs [6]device.Event
	for i := range evs {
		evs[i], err = d.NewTimingEvent()
		require.NoError(t, err)
	}
	var ss [3]device.Stream
	for i := range ss {
		ss[i], err = d.NewStream()
		require.NoError(t, err)
	}
	p, _ := d.Alloc(3 << 20)
	h, _ := d.AllocHost(3 << 20)
	require.NoError(t, d.Record(evs[0], ss[0]))
	require.NoError(t, d.CopyH2D(p, h.Slice(0, 1<<20), ss[0]))
	require.NoError(t, d.Record(evs[1], ss[0]))
	require.NoError(t, d.SyncStream(ss[0]))
	require.NoError(t, d.CopyH2D(p.Add(1<<20), h.Slice(1<<20, 1<<20), ss[1]))
	require.NoError(t, d.Record(evs[2], ss[1]))
	require.NoError(t, d.CopyD2H(h.Slice(2<<20, 1<<20), p.Add(2<<20), ss[2]))
	require.NoError(t, d.Record(evs[3], ss[2]))
	for _, s := range ss {
		require.NoError(t, d.SyncStream(s))
	}
	second, err := d.Elapsed(evs[0], evs[2])
	require.NoError(t, err)
	other, err := d.Elapsed(evs[0], evs[3])
	require.NoError(t, err)
	assert.Equal(t, 2*1048576*time.Nanosecond, second, "the second H2D copy waited for the link")
	assert.Equal(t, 1048576*time.Nanosecond, other, "D2H has a link of its own")
}
