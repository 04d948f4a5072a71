package device_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/host"
)

// ordered records, in order, the waits a device queues and the allocator's
// wait hook calls.
type ordered struct {
	device.Device
	mu  sync.Mutex
	log []string
}

func (o *ordered) StreamWait(s device.Stream, ev device.Event) error {
	o.add("wait")
	return o.Device.StreamWait(s, ev)
}

func (o *ordered) add(s string) {
	o.mu.Lock()
	o.log = append(o.log, s)
	o.mu.Unlock()
}

func (o *ordered) take() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	l := o.log
	o.log = nil
	return l
}

// TestAllocatorWaitHook: the hook brackets the waits an allocation queues on
// its stream, and is not called when the allocation queues none.
func TestAllocatorWaitHook(t *testing.T) {
	hd, err := host.New(64 << 20)
	require.NoError(t, err)
	defer hd.Close()
	d := &ordered{Device: hd}
	a := newAllocator(t, d, 1<<20)
	var streams []device.Stream
	a.OnStreamWait(func(s device.Stream, after bool) {
		streams = append(streams, s)
		if after {
			d.add("after")
		} else {
			d.add("before")
		}
	})
	s1, err := d.NewStream()
	require.NoError(t, err)
	s2, err := d.NewStream()
	require.NoError(t, err)
	ev, err := d.NewEvent()
	require.NoError(t, err)
	hold := make(chan struct{})
	require.NoError(t, hd.Launch(s1, func() { <-hold }))
	defer close(hold)
	require.NoError(t, d.Record(ev, s1))

	p, err := a.Alloc(1<<20, s1)
	require.NoError(t, err)
	require.NoError(t, a.FreeAfter(p, ev, s1))
	p, err = a.Alloc(1<<20, s1)
	require.NoError(t, err)
	assert.Empty(t, d.take(), "same stream: no wait, no hook")
	require.NoError(t, a.FreeAfter(p, ev, s1))
	_, err = a.Alloc(1<<20, s2)
	require.NoError(t, err)
	assert.Equal(t, []string{"before", "wait", "after"}, d.take())
	assert.Equal(t, []device.Stream{s2, s2}, streams)

	a.OnStreamWait(nil)
	require.NoError(t, a.Free(p))
}
