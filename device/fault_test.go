package device_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/host"
)

var errInjected = errors.New("injected fault")

// faulty is a device whose NewEvent, Record and SyncStream fail on demand:
// each armed method fails on its next call, once.
type faulty struct {
	device.Device
	mu    sync.Mutex
	armed map[string]int
}

func (f *faulty) arm(method string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.armed == nil {
		f.armed = map[string]int{}
	}
	f.armed[method]++
}

func (f *faulty) fail(method string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.armed[method] == 0 {
		return false
	}
	f.armed[method]--
	return true
}

func (f *faulty) NewEvent() (device.Event, error) {
	if f.fail("NewEvent") {
		return 0, errInjected
	}
	return f.Device.NewEvent()
}

func (f *faulty) Record(ev device.Event, s device.Stream) error {
	if f.fail("Record") {
		return errInjected
	}
	return f.Device.Record(ev, s)
}

func (f *faulty) SyncStream(s device.Stream) error {
	if f.fail("SyncStream") {
		return errInjected
	}
	return f.Device.SyncStream(s)
}

// freeOnPool is what TestFreeOnGuardFailure needs of an Allocator and of a
// HostPool: a block of size bytes for s, freed behind s's work.
type freeOnPool struct {
	get   func(size int64, s device.Stream) (uintptr, error)
	putOn func(ptr uintptr, s device.Stream) error
	stats func() device.Stats
}

// TestFreeOnGuardFailure: a free behind a stream's work whose guard event
// cannot be made or recorded loses no memory. The host waits for the stream
// instead, the block is free at once (nothing left in use), the error names
// the fault and the block, and the only block that fits the pool is served
// again.
func TestFreeOnGuardFailure(t *testing.T) {
	const size = 64 << 10
	pools := map[string]func(t *testing.T, d device.Device) freeOnPool{
		"allocator": func(t *testing.T, d device.Device) freeOnPool {
			a := newAllocator(t, d, size)
			return freeOnPool{
				get: func(n int64, s device.Stream) (uintptr, error) {
					p, err := a.Alloc(n, s)
					return uintptr(p), err
				},
				putOn: func(p uintptr, s device.Stream) error { return a.FreeOn(device.DevPtr(p), s) },
				stats: a.Stats,
			}
		},
		"host pool": func(t *testing.T, d device.Device) freeOnPool {
			h := device.NewHostPool(d)
			require.NoError(t, h.Reserve(size))
			t.Cleanup(func() { h.Close() })
			bufs := map[uintptr]device.HostBuf{}
			return freeOnPool{
				get: func(n int64, s device.Stream) (uintptr, error) {
					b, err := h.Get(n, s)
					if err != nil {
						return 0, err
					}
					bufs[uintptr(b.Ptr())] = b
					return uintptr(b.Ptr()), nil
				},
				putOn: func(p uintptr, s device.Stream) error { return h.PutOn(bufs[p], s) },
				stats: h.Stats,
			}
		},
	}
	for name, newPool := range pools {
		for _, method := range []string{"Record", "NewEvent"} {
			t.Run(fmt.Sprintf("%s/%s fails", name, method), func(t *testing.T) {
				hd, err := host.New(1 << 20)
				require.NoError(t, err)
				defer hd.Close()
				d := &faulty{Device: hd}
				p := newPool(t, d)
				s, err := d.NewStream()
				require.NoError(t, err)
				other, err := d.NewStream()
				require.NoError(t, err)

				ptr, err := p.get(size, s)
				require.NoError(t, err)
				var done atomic.Bool
				require.NoError(t, hd.Launch(s, func() {
					time.Sleep(20 * time.Millisecond)
					done.Store(true)
				}))
				d.arm(method)
				err = p.putOn(ptr, s)
				require.ErrorIs(t, err, errInjected)
				assert.Contains(t, err.Error(), fmt.Sprintf("%#x", ptr), "the error names the block")
				assert.Contains(t, err.Error(), fmt.Sprintf("%d bytes", size), "the error names the block's size")
				assert.True(t, done.Load(), "the block was freed before the work queued on its stream ran")

				st := p.stats()
				assert.Zero(t, st.Allocated, "bytes left in use after the free")
				assert.Zero(t, st.InUse)
				assert.Zero(t, st.PendingBlocks)
				ptr2, err := p.get(size, other)
				require.NoError(t, err, "the only block that fits is served again")
				assert.Equal(t, ptr, ptr2)
				require.NoError(t, p.putOn(ptr2, other))
				assert.Zero(t, p.stats().Allocated)
			})
		}
		t.Run(name+"/Record and SyncStream fail", func(t *testing.T) {
			hd, err := host.New(1 << 20)
			require.NoError(t, err)
			defer hd.Close()
			d := &faulty{Device: hd}
			p := newPool(t, d)
			s, err := d.NewStream()
			require.NoError(t, err)

			// The block is held until a wait for its stream succeeds: the
			// next request reclaims it.
			ptr, err := p.get(size, s)
			require.NoError(t, err)
			d.arm("Record")
			d.arm("SyncStream")
			err = p.putOn(ptr, s)
			require.ErrorIs(t, err, errInjected)
			assert.Contains(t, err.Error(), fmt.Sprintf("%#x", ptr))
			assert.Equal(t, int64(size), p.stats().Allocated, "held, not handed out")
			ptr2, err := p.get(size, s)
			require.NoError(t, err, "the held block is reclaimed")
			assert.Equal(t, ptr, ptr2)

			// A free of a held block frees it as usual.
			d.arm("Record")
			d.arm("SyncStream")
			require.Error(t, p.putOn(ptr2, s))
			require.NoError(t, p.putOn(ptr2, s), "freed again")
			assert.Zero(t, p.stats().Allocated)
			ptr3, err := p.get(size, s)
			require.NoError(t, err)
			require.NoError(t, p.putOn(ptr3, s))
			assert.Zero(t, p.stats().Allocated)
		})
	}
}
