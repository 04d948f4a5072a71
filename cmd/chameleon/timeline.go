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

// cudaTimeline is replay.Timeline on CUDA: the spin kernel that writes
// its start and end (the GPU's global timer) into a slot of a device
// buffer outside the Engine's limit, read back through pinned memory.
type cudaTimeline struct {
	d    *cuda.Device
	sp   *driver.Spinner
	buf  device.DevPtr
	host device.HostBuf
	n    int
}

func newCUDATimeline(d *cuda.Device, sp *driver.Spinner, n int) (*cudaTimeline, error) {
	buf, err := d.Alloc(int64(n) * 16)
	if err != nil {
		return nil, fmt.Errorf("--timeline: %w", err)
	}
	h, err := d.AllocHost(int64(n) * 16)
	if err != nil {
		d.Free(buf)
		return nil, fmt.Errorf("--timeline: %w", err)
	}
	return &cudaTimeline{d: d, sp: sp, buf: buf, host: h, n: n}, nil
}

func (c *cudaTimeline) Launch(s device.Stream, t time.Duration, slot int) error {
	if slot < 0 || slot >= c.n {
		return fmt.Errorf("timeline: slot %d of %d: %w", slot, c.n, device.ErrInvalidValue)
	}
	return c.sp.SpinAt(s, t.Nanoseconds(), c.buf+device.DevPtr(slot*16))
}

func (c *cudaTimeline) Stamps(n int) ([]replay.Stamp, error) {
	if n < 0 || n > c.n {
		return nil, fmt.Errorf("timeline: %d stamps of %d: %w", n, c.n, device.ErrInvalidValue)
	}
	s := c.d.DefaultStream()
	if err := c.d.CopyD2H(c.host.Slice(0, int64(n)*16), c.buf, s); err != nil {
		return nil, err
	}
	if err := c.d.SyncStream(s); err != nil {
		return nil, err
	}
	b := c.host.Bytes()
	out := make([]replay.Stamp, n)
	for i := range out {
		out[i] = replay.Stamp{Start: int64(binary.LittleEndian.Uint64(b[16*i:])), End: int64(binary.LittleEndian.Uint64(b[16*i+8:]))}
	}
	return out, nil
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
	if err := replay.WriteTimeline(f, fmt.Sprintf("%s: %s", rep.Trace, rep.TimelineOf), rep.Timeline); err != nil {
		f.Close()
		return fmt.Errorf("--timeline %s: %w", path, err)
	}
	return f.Close()
}
