package ascend

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/internal/fakelib"
)

// TestTimingEvents runs the timing path through the purego bindings:
// aclrtCreateEventWithFlag with ACL_EVENT_TIME_LINE, aclrtEventElapsedTime's
// milliseconds as a Duration, ACL_ERROR_RT_EVENT_NOT_COMPLETE as
// device.ErrNotReady, other codes named, and the events the device refuses
// before the call (made by NewEvent, never recorded).
func TestTimingEvents(t *testing.T) {
	d, _ := newFake(t)
	defer d.Close()
	tc := fakelib.OpenTiming(t, buildFake(t, "default"))

	start, err := d.NewTimingEvent()
	require.NoError(t, err)
	end, err := d.NewTimingEvent()
	require.NoError(t, err)
	plain, err := d.NewEvent()
	require.NoError(t, err)

	_, err = d.Elapsed(start, end)
	assert.ErrorIs(t, err, device.ErrInvalidValue, "never recorded")

	s := d.DefaultStream()
	require.NoError(t, d.Record(start, s))
	tc.Advance(1_250_000)
	require.NoError(t, d.Record(end, s))
	require.NoError(t, d.Record(plain, s))
	el, err := d.Elapsed(start, end)
	require.NoError(t, err)
	assert.InDelta(t, 1.25e6, float64(el), 1e3)

	tc.NotReady(1)
	_, err = d.Elapsed(start, end)
	assert.ErrorIs(t, err, device.ErrNotReady)
	tc.FailElapsed(int32(ErrorRTInternal))
	_, err = d.Elapsed(start, end)
	require.Error(t, err)
	assert.NotErrorIs(t, err, device.ErrNotReady)
	assert.Contains(t, err.Error(), "ACL_ERROR_RT_INTERNAL_ERROR")
	_, err = d.Elapsed(plain, end)
	assert.ErrorIs(t, err, device.ErrInvalidValue, "an event without timing")

	el, err = d.Elapsed(end, start)
	require.NoError(t, err)
	assert.InDelta(t, -1.25e6, float64(el), 1e3)
}

// TestTimingUnsupported: a runtime without the timing calls loads, and says
// so when a timing event is asked for.
func TestTimingUnsupported(t *testing.T) {
	path := buildFake(t, "notiming", "-DOMIT_TIMING")
	d, err := New(WithLibrary(path))
	require.NoError(t, err)
	defer d.Close()
	_, err = d.NewTimingEvent()
	assert.ErrorIs(t, err, device.ErrNotSupported)
}
