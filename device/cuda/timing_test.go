package cuda

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/internal/fakelib"
)

// TestTimingEvents runs the timing path through the purego bindings:
// timing events are created with timing on (flags 0, where NewEvent's have
// cudaEventDisableTiming), cudaEventElapsedTime's milliseconds become a
// Duration, and its errors map to the device sentinels.
func TestTimingEvents(t *testing.T) {
	d, ctl := newFake(t)
	defer d.Close()
	tc := fakelib.OpenTiming(t, buildFake(t, "default"))

	start, err := d.NewTimingEvent()
	require.NoError(t, err)
	assert.EqualValues(t, 0, ctl.last(lastEventFlags), "timing on")
	end, err := d.NewTimingEvent()
	require.NoError(t, err)
	plain, err := d.NewEvent()
	require.NoError(t, err)
	assert.EqualValues(t, eventDisableTiming, ctl.last(lastEventFlags))

	_, err = d.Elapsed(start, end)
	assert.ErrorIs(t, err, device.ErrInvalidValue, "never recorded")
	assert.Contains(t, err.Error(), "cudaEventElapsedTime")

	s := d.DefaultStream()
	require.NoError(t, d.Record(start, s))
	tc.Advance(2_500_000) // 2.5 ms of device time
	require.NoError(t, d.Record(end, s))
	require.NoError(t, d.Record(plain, s))
	el, err := d.Elapsed(start, end)
	require.NoError(t, err)
	assert.InDelta(t, 2.5e6, float64(el), 1e3, "2.5 ms, to the float's resolution")

	tc.NotReady(1)
	_, err = d.Elapsed(start, end)
	assert.ErrorIs(t, err, device.ErrNotReady)
	tc.FailElapsed(999)
	_, err = d.Elapsed(start, end)
	require.Error(t, err)
	assert.NotErrorIs(t, err, device.ErrNotReady)
	assert.Contains(t, err.Error(), "cudaErrorUnknown")
	_, err = d.Elapsed(start, plain)
	assert.ErrorIs(t, err, device.ErrInvalidValue, "an event without timing")

	el, err = d.Elapsed(end, start)
	require.NoError(t, err)
	assert.InDelta(t, -2.5e6, float64(el), 1e3, "the failures were injected once")
	for _, e := range []device.Event{start, end, plain} {
		require.NoError(t, d.DestroyEvent(e))
	}
	require.NoError(t, d.Close())
	_, err = d.Elapsed(start, end)
	assert.ErrorIs(t, err, device.ErrClosed)
	_, err = d.NewTimingEvent()
	assert.ErrorIs(t, err, device.ErrClosed)
}
