package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"time"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/cuda"
	"github.com/chameleon-go/chameleon/device/cuda/driver"
	"github.com/chameleon-go/chameleon/replay"
	"github.com/chameleon-go/chameleon/trace"
)

// maxOps is the most ops of one of tr's iterations: the timeline's slots.
func maxOps(tr *trace.Trace) int {
	n := 1
	for _, it := range tr.Iterations {
		n = max(n, len(it.Ops))
	}
	return n
}

// cudaTimeline is replay.CopyTimeline on CUDA: the spin kernel that
// writes its start and end (the GPU's global timer) into a slot of a
// device buffer outside the Engine's limit, read back through pinned
// memory. Slots [0, n) are the op kernels', the rest the copies' stamps.
type cudaTimeline struct {
	*replay.CopyStamps
	d    *cuda.Device
	sp   *driver.Spinner
	buf  device.DevPtr
	host device.HostBuf
	n    int
}

func newCUDATimeline(d *cuda.Device, sp *driver.Spinner, n int) (*cudaTimeline, error) {
	size := int64(n+2*replay.CopySlots) * 16
	buf, err := d.Alloc(size)
	if err != nil {
		return nil, fmt.Errorf("--timeline: %w", err)
	}
	h, err := d.AllocHost(size)
	if err != nil {
		d.Free(buf)
		return nil, fmt.Errorf("--timeline: %w", err)
	}
	c := &cudaTimeline{d: d, sp: sp, buf: buf, host: h, n: n}
	// The copies' slots start at 0: a stamp is fresh when it is later
	// than the one read there before.
	clear(h.Bytes())
	if err := c.d.CopyH2D(buf, h, d.DefaultStream()); err != nil {
		c.close()
		return nil, fmt.Errorf("--timeline: %w", err)
	}
	c.CopyStamps = replay.NewCopyStamps(func(s device.Stream, slot int) error { return c.spin(s, 0, slot) }, c.slots, n, replay.CopySlots)
	return c, nil
}

func (c *cudaTimeline) Launch(s device.Stream, t time.Duration, slot int) error {
	if slot < 0 || slot >= c.n {
		return fmt.Errorf("timeline: slot %d of %d: %w", slot, c.n, device.ErrInvalidValue)
	}
	return c.spin(s, t, slot)
}

func (c *cudaTimeline) spin(s device.Stream, t time.Duration, slot int) error {
	return c.sp.SpinAt(s, t.Nanoseconds(), c.buf+device.DevPtr(slot*16))
}

func (c *cudaTimeline) Stamps(n int) ([]replay.Stamp, error) {
	if n < 0 || n > c.n {
		return nil, fmt.Errorf("timeline: %d stamps of %d: %w", n, c.n, device.ErrInvalidValue)
	}
	return c.slots(0, n)
}

// slots reads the stamps of slots [lo, hi) on the default stream. The copy
// streams may still be writing theirs: a slot read half-written is not
// yet fresh (its end before its start, or older than the copy's).
func (c *cudaTimeline) slots(lo, hi int) ([]replay.Stamp, error) {
	s := c.d.DefaultStream()
	off := int64(lo) * 16
	if err := c.d.CopyD2H(c.host.Slice(off, int64(hi-lo)*16), c.buf+device.DevPtr(off), s); err != nil {
		return nil, err
	}
	if err := c.d.SyncStream(s); err != nil {
		return nil, err
	}
	b := c.host.Bytes()[off:]
	out := make([]replay.Stamp, hi-lo)
	for i := range out {
		out[i] = replay.Stamp{Start: int64(binary.LittleEndian.Uint64(b[16*i:])), End: int64(binary.LittleEndian.Uint64(b[16*i+8:]))}
	}
	return out, nil
}

// stampedCUDA is the CUDA device with each copy to or from the host
// stamped on the timeline (--timeline).
type stampedCUDA struct {
	*cuda.Device
	tl replay.CopyTimeline
}

func (d *stampedCUDA) CopyD2H(dst device.HostBuf, src device.DevPtr, s device.Stream) error {
	return d.tl.Around(s, true, dst.Len(), func() error { return d.Device.CopyD2H(dst, src, s) })
}

func (d *stampedCUDA) CopyH2D(dst device.DevPtr, src device.HostBuf, s device.Stream) error {
	return d.tl.Around(s, false, src.Len(), func() error { return d.Device.CopyH2D(dst, src, s) })
}

func (c *cudaTimeline) close() {
	c.d.SyncStream(c.d.DefaultStream())
	c.d.FreeHost(c.host)
	c.d.Free(c.buf)
}

// writeTimeline writes rep's stamped iteration to path as Chrome trace JSON.
func writeTimeline(path string, rep *replay.Report) error {
	if len(rep.Timeline) == 0 {
		return fmt.Errorf("--timeline %s: no iteration was stamped", path)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--timeline: %w", err)
	}
	if err := replay.WriteTimeline(f, fmt.Sprintf("%s: %s", rep.Trace, rep.TimelineOf), rep.Timeline, rep.TimelineCopies, rep.TimelineSim); err != nil {
		f.Close()
		return fmt.Errorf("--timeline %s: %w", path, err)
	}
	return f.Close()
}
