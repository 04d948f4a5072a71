// Package host is a pure-Go implementation of device.Device. "Device memory"
// is ordinary Go memory behind a capacity limit, streams are goroutines that
// run their work in FIFO order, and events follow CUDA semantics, so the
// engine and its tests run the same swap path with no accelerator. An
// optional link model (bandwidth per direction, with an injectable sleep)
// makes copies take time, which timing-sensitive code needs to be tested.
package host

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/chameleon-go/chameleon/device"
)

// Option configures a Device.
type Option interface{ apply(*config) }

type config struct {
	name         string
	h2d, d2h     float64
	sleep        func(time.Duration)
	hostCapacity int64
	pageSize     int64
	noMap        bool
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithName sets the name Name returns (default "host").
func WithName(name string) Option {
	return optionFunc(func(c *config) {
		if name != "" {
			c.name = name
		}
	})
}

// WithBandwidth turns on the link model: a host-to-device copy of n bytes
// occupies the H2D link for n/h2d seconds, and likewise for D2H. Copies in
// one direction share the link, as on PCIe, so two streams copying the same
// way take turns. Non-positive values leave that direction instantaneous
// (the default).
func WithBandwidth(h2d, d2h float64) Option {
	return optionFunc(func(c *config) {
		c.h2d, c.d2h = max(h2d, 0), max(d2h, 0)
	})
}

// WithSleep replaces time.Sleep in the link model, so that tests can count or
// scale the time copies take. nil is ignored.
func WithSleep(sleep func(time.Duration)) Option {
	return optionFunc(func(c *config) {
		if sleep != nil {
			c.sleep = sleep
		}
	})
}

// WithHostCapacity limits pinned host memory (default unlimited), so that
// host-pool exhaustion can be tested. Non-positive values mean unlimited.
func WithHostCapacity(n int64) Option {
	return optionFunc(func(c *config) { c.hostCapacity = max(n, 0) })
}

// addrBase is the first device address handed out. Device addresses are
// synthetic: a nonzero base keeps 0 invalid, and a guard gap between
// allocations makes an overrunning copy fail instead of silently touching a
// neighbour.
const (
	addrBase  = 1 << 40
	addrAlign = 4096
)

// maxGoAlloc is the largest slice Go makes on 64-bit platforms (2^48
// bytes); beyond it make panics.
const maxGoAlloc = 1 << 48

// Device is the pure-Go backend. Create it with New.
type Device struct {
	cfg      config
	capacity int64
	machine  int64 // what Go can allocate here: machineBytes

	mu        sync.Mutex
	closed    bool
	allocs    []allocation // sorted by base
	nextAddr  uintptr
	allocated int64
	peak      int64
	hostBufs  map[*byte]int64
	hostBytes int64
	released  [][]byte // reservations given back, unmapped at Close

	streams    map[device.Stream]*stream
	nextStream device.Stream
	events     map[device.Event]*event
	nextEvent  device.Event

	links   [2]sync.Mutex    // H2D, D2H
	linkAt  [2]time.Duration // when each direction's link is free, in modeled time; under links
	workers sync.WaitGroup
}

type allocation struct {
	base device.DevPtr
	mem  []byte
	// pages marks the mapped pages of a reservation (ReserveAddress); nil
	// for memory from Alloc.
	pages []bool
}

var _ device.Device = (*Device)(nil)

// New returns a device with capacity bytes of device memory. Its default
// stream is device.Stream(0). Whatever the capacity, an allocation (device
// or host) that would take this device past the machine's memory (physical
// plus swap on Linux) fails with device.ErrOutOfMemory.
func New(capacity int64, opts ...Option) (*Device, error) {
	if capacity <= 0 {
		return nil, fmt.Errorf("host: capacity %d: %w", capacity, device.ErrInvalidValue)
	}
	cfg := config{name: "host", sleep: time.Sleep, pageSize: DefaultPageSize}
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	d := &Device{
		cfg:        cfg,
		capacity:   capacity,
		machine:    machineBytes(),
		nextAddr:   addrBase,
		hostBufs:   make(map[*byte]int64),
		streams:    make(map[device.Stream]*stream),
		nextStream: 1,
		events:     make(map[device.Event]*event),
		nextEvent:  1,
	}
	d.streams[0] = d.startStream()
	return d, nil
}

// Name implements device.Device.
func (d *Device) Name() string { return d.cfg.name }

// PeakAllocated returns the highest number of device bytes allocated at once
// since New: what engine tests compare with their memory limit.
func (d *Device) PeakAllocated() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.peak
}

// Allocated returns the device bytes allocated now.
func (d *Device) Allocated() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.allocated
}

// Alloc implements device.Device.
func (d *Device) Alloc(size int64) (device.DevPtr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, fmt.Errorf("host: alloc %d bytes: %w", size, device.ErrClosed)
	}
	if size <= 0 {
		return 0, fmt.Errorf("host: alloc %d bytes: %w", size, device.ErrInvalidValue)
	}
	if size > d.capacity-d.allocated {
		return 0, fmt.Errorf("host: alloc %d bytes with %d of %d in use: %w",
			size, d.allocated, d.capacity, device.ErrOutOfMemory)
	}
	if err := d.fitsMachine(size); err != nil {
		return 0, fmt.Errorf("host: alloc %d bytes: %w", size, err)
	}
	p := device.DevPtr(d.nextAddr)
	d.nextAddr += uintptr((size+addrAlign-1)/addrAlign*addrAlign) + addrAlign
	// Appending keeps allocs sorted: addresses only grow.
	d.allocs = append(d.allocs, allocation{base: p, mem: make([]byte, size)})
	d.allocated += size
	d.peak = max(d.peak, d.allocated)
	return p, nil
}

// fitsMachine refuses an allocation that, with what this device already
// holds, exceeds the machine's memory: the Go runtime would die of it
// instead of returning an error. Called with d.mu held.
func (d *Device) fitsMachine(size int64) error {
	if held := d.allocated + d.hostBytes; size > d.machine-held {
		return fmt.Errorf("more than this machine can allocate (%d bytes of memory and swap, %d held by this device): %w",
			d.machine, held, device.ErrOutOfMemory)
	}
	return nil
}

// Free implements device.Device. Copies already queued keep the memory they
// resolved alive, so freeing behind them is as safe as cudaFree, which
// synchronizes.
func (d *Device) Free(p device.DevPtr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("host: free %#x: %w", uintptr(p), device.ErrClosed)
	}
	i, ok := slices.BinarySearchFunc(d.allocs, p, func(a allocation, p device.DevPtr) int {
		return compare(a.base, p)
	})
	if !ok || d.allocs[i].pages != nil {
		return fmt.Errorf("host: free %#x: not an allocation: %w", uintptr(p), device.ErrInvalidValue)
	}
	d.allocated -= int64(len(d.allocs[i].mem))
	d.allocs = slices.Delete(d.allocs, i, i+1)
	return nil
}

func compare(a, b device.DevPtr) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// resolve returns the device bytes [p, p+n). Called with d.mu held.
func (d *Device) resolve(p device.DevPtr, n int64) ([]byte, error) {
	i, found := slices.BinarySearchFunc(d.allocs, p, func(a allocation, p device.DevPtr) int {
		return compare(a.base, p)
	})
	if !found {
		i--
	}
	if i < 0 || n < 0 {
		return nil, fmt.Errorf("host: range %#x+%d: %w", uintptr(p), n, device.ErrInvalidValue)
	}
	a := d.allocs[i]
	off := int64(p - a.base)
	if off+n > int64(len(a.mem)) {
		return nil, fmt.Errorf("host: range %#x+%d outside allocation %#x+%d: %w",
			uintptr(p), n, uintptr(a.base), len(a.mem), device.ErrInvalidValue)
	}
	if a.pages != nil && n > 0 {
		page := d.cfg.pageSize
		for i := off / page; i <= (off+n-1)/page; i++ {
			if !a.pages[i] {
				return nil, fmt.Errorf("host: range %#x+%d: page %d of reservation %#x not mapped: %w",
					uintptr(p), n, i, uintptr(a.base), device.ErrInvalidValue)
			}
		}
	}
	return a.mem[off : off+n : off+n], nil
}

// AllocHost implements device.Device with ordinary Go memory: nothing on this
// backend needs pinning.
func (d *Device) AllocHost(size int64) (device.HostBuf, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return device.HostBuf{}, fmt.Errorf("host: alloc host %d bytes: %w", size, device.ErrClosed)
	}
	if size <= 0 {
		return device.HostBuf{}, fmt.Errorf("host: alloc host %d bytes: %w", size, device.ErrInvalidValue)
	}
	if c := d.cfg.hostCapacity; c > 0 && size > c-d.hostBytes {
		return device.HostBuf{}, fmt.Errorf("host: alloc host %d bytes with %d of %d in use: %w",
			size, d.hostBytes, c, device.ErrOutOfMemory)
	}
	if err := d.fitsMachine(size); err != nil {
		return device.HostBuf{}, fmt.Errorf("host: alloc host %d bytes: %w", size, err)
	}
	b := make([]byte, size)
	d.hostBufs[&b[0]] = size
	d.hostBytes += size
	return device.WrapHost(b), nil
}

// FreeHost implements device.Device.
func (d *Device) FreeHost(b device.HostBuf) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("host: free host: %w", device.ErrClosed)
	}
	if b.Len() == 0 {
		return fmt.Errorf("host: free host: empty buffer: %w", device.ErrInvalidValue)
	}
	key := &b.Bytes()[0]
	size, ok := d.hostBufs[key]
	if !ok {
		return fmt.Errorf("host: free host %p: not from AllocHost: %w", key, device.ErrInvalidValue)
	}
	delete(d.hostBufs, key)
	d.hostBytes -= size
	return nil
}

// MemInfo implements device.Device.
func (d *Device) MemInfo() (free, total int64, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, 0, fmt.Errorf("host: mem info: %w", device.ErrClosed)
	}
	return d.capacity - d.allocated, d.capacity, nil
}

// ReadDevice implements device.Device.
func (d *Device) ReadDevice(dst []byte, src device.DevPtr) error {
	if err := d.syncAll(); err != nil {
		return fmt.Errorf("host: read device: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	mem, err := d.resolve(src, int64(len(dst)))
	if err != nil {
		return fmt.Errorf("host: read device: %w", err)
	}
	copy(dst, mem)
	return nil
}

// WriteDevice implements device.Device.
func (d *Device) WriteDevice(dst device.DevPtr, src []byte) error {
	if err := d.syncAll(); err != nil {
		return fmt.Errorf("host: write device: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	mem, err := d.resolve(dst, int64(len(src)))
	if err != nil {
		return fmt.Errorf("host: write device: %w", err)
	}
	copy(mem, src)
	return nil
}

// Close drains every stream, stops their goroutines and invalidates all
// handles. It is idempotent.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	for _, s := range d.streams {
		s.stop()
	}
	d.streams = nil
	d.events = nil
	mems := d.released
	for _, a := range d.allocs {
		if a.pages != nil {
			mems = append(mems, a.mem)
		}
	}
	d.allocs, d.released = nil, nil
	d.mu.Unlock()
	d.workers.Wait()
	for _, m := range mems {
		releaseMem(m)
	}
	return nil
}
