package host

import (
	"fmt"
	"time"

	"github.com/chameleon-go/chameleon/device"
)

// Launch queues fn as work on stream s: it runs on the stream's goroutine
// after everything queued on s before it (copies, waits on events) and
// before everything queued after it, and a Record after it captures it. It
// is this backend's kernel launch. A host that computes on the host backend
// needs it because the Engine orders a swapped-in tensor's use with a
// StreamWait on the compute stream, not with a host wait: a kernel run on
// the caller's goroutine would read the tensor before its copy back
// completed, while one queued here runs after it.
//
// fn must not call methods of d that wait for streams (SyncStream,
// SyncEvent, ReadDevice, WriteDevice): it runs on a stream and would wait for
// itself. A panic in fn is not recovered.
func (d *Device) Launch(s device.Stream, fn func()) error {
	if fn == nil {
		return fmt.Errorf("host: launch: nil function: %w", device.ErrInvalidValue)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	st, err := d.stream("launch", s)
	if err != nil {
		return err
	}
	st.push(op{kind: opFunc, fn: fn})
	return nil
}

// LaunchFor is Launch of a kernel that takes cost on the stream's modeled
// clock (see Elapsed): fn runs as with Launch, and timing events recorded
// after it read cost later than those recorded before, however long fn
// itself took. fn may be nil: the stream is then only busy for cost, in
// modeled time, and returns at once.
func (d *Device) LaunchFor(s device.Stream, cost time.Duration, fn func()) error {
	if cost < 0 {
		return fmt.Errorf("host: launch for %v: negative cost: %w", cost, device.ErrInvalidValue)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	st, err := d.stream("launch", s)
	if err != nil {
		return err
	}
	st.push(op{kind: opFunc, fn: fn, cost: cost})
	return nil
}

// Bytes returns the device memory [p, p+n) itself, not a copy, so that a
// function queued with Launch can read and write it as a kernel does. It
// returns nil when the range is not inside one allocation or the device is
// closed.
//
// The slice stays valid while the allocation lives (Free does not reclaim
// memory that a slice still refers to, but writes to it no longer reach the
// device). Access it only from work ordered on a stream, or after
// synchronizing: like device memory on a GPU, it is shared with the copies
// queued on every stream.
func (d *Device) Bytes(p device.DevPtr, n int64) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	b, err := d.resolve(p, n)
	if err != nil {
		return nil
	}
	return b
}
