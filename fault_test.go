package chameleon_test

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/host"
)

var errInjected = errors.New("injected fault")

// faulty is a device whose copies, event records and stream waits fail on
// demand: the n-th call of the armed method after arming fails, once.
type faulty struct {
	device.Device
	mu     sync.Mutex
	method string
	left   int
	fired  bool
}

func (f *faulty) arm(method string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.method, f.left, f.fired = method, n, false
}

func (f *faulty) fail(method string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.method != method || f.left == 0 {
		return false
	}
	f.left--
	if f.left == 0 {
		f.fired, f.method = true, ""
		return true
	}
	return false
}

func (f *faulty) CopyH2D(dst device.DevPtr, src device.HostBuf, s device.Stream) error {
	if f.fail("CopyH2D") {
		return errInjected
	}
	return f.Device.CopyH2D(dst, src, s)
}

func (f *faulty) CopyD2H(dst device.HostBuf, src device.DevPtr, s device.Stream) error {
	if f.fail("CopyD2H") {
		return errInjected
	}
	return f.Device.CopyD2H(dst, src, s)
}

func (f *faulty) CopyD2D(dst, src device.DevPtr, n int64, s device.Stream) error {
	if f.fail("CopyD2D") {
		return errInjected
	}
	return f.Device.CopyD2D(dst, src, n, s)
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

func (f *faulty) StreamWait(s device.Stream, ev device.Event) error {
	if f.fail("StreamWait") {
		return errInjected
	}
	return f.Device.StreamWait(s, ev)
}

// TestFaultsLeaveNothingBehind injects one fault into each step of a swap
// out (forced by an allocation), of a swap in (forced by a use) and of a
// free (a release, whose memory is guarded by an event): the
// call fails with a clear error, and the Engine stays usable: the step
// succeeds when retried, every tensor comes back byte-identical, and once
// every tensor is released no device or pinned memory is left held.
func TestFaultsLeaveNothingBehind(t *testing.T) {
	const size = 40 << 10
	faults := []struct {
		method string
		n      int
	}{
		{"CopyD2H", 1}, {"CopyH2D", 1},
		{"Record", 1}, {"Record", 2}, {"Record", 3},
		{"StreamWait", 1}, {"StreamWait", 2}, {"StreamWait", 3},
		{"NewEvent", 1}, {"NewEvent", 2},
	}
	for _, fl := range faults {
		for _, phase := range []string{"evict", "use", "release"} {
			t.Run(fmt.Sprintf("%s#%d during %s", fl.method, fl.n, phase), func(t *testing.T) {
				hd, err := host.New(64 << 10)
				require.NoError(t, err)
				defer hd.Close()
				dev := &faulty{Device: hd}
				eng, err := chameleon.New(dev, chameleon.WithMemoryLimit(64<<10))
				require.NoError(t, err)
				defer eng.Close()
				want := map[*chameleon.Tensor][]byte{}
				check := func(tn *chameleon.Tensor) {
					got := make([]byte, size)
					require.NoError(t, hd.ReadDevice(got, tn.Ptr()))
					require.True(t, bytes.Equal(want[tn], got), "tensor %d changed", tn.ID())
				}
				// step runs f, with the fault armed when this is the phase
				// under test; a failed step must name the fault and succeed
				// when run again.
				step := func(name string, f func() error) {
					if name == phase {
						dev.arm(fl.method, fl.n)
					}
					err := f()
					fired := dev.fired
					dev.arm("", 0)

					if err != nil {
						require.True(t, fired, "%s failed with no fault: %v", name, err)
						require.ErrorIs(t, err, errInjected)
						assert.Contains(t, err.Error(), "tensor", "the error names the tensor")
						require.NoError(t, f(), "%s again after the fault", name)
					}
					if name == "release" && phase == "release" && fl.method == "Record" && fl.n == 1 {
						require.True(t, fired, "the fault was armed where it cannot fire")
					}
				}
				it := eng.Begin()
				newFilled := func(seed byte) *chameleon.Tensor {
					var tn *chameleon.Tensor
					step("evict", func() (err error) {
						tn, err = eng.NewTensor(size, chameleon.Activation, "uint8", []int64{size})
						return err
					})
					op := &chameleon.Op{Name: "fill", Out: []*chameleon.Tensor{tn}}
					require.NoError(t, it.Before(op))
					want[tn] = bytes.Repeat([]byte{seed}, size)
					require.NoError(t, hd.WriteDevice(tn.Ptr(), want[tn]))
					require.NoError(t, it.After(op))
					return tn
				}
				a := newFilled(1)
				b := newFilled(2) // a leaves to make room
				use := &chameleon.Op{Name: "read", In: []*chameleon.Tensor{a}}
				step("use", func() error { return it.Before(use) }) // b leaves, a comes back
				check(a)
				require.NoError(t, it.After(use))
				use = &chameleon.Op{Name: "read", In: []*chameleon.Tensor{b}}
				require.NoError(t, it.Before(use))
				check(b)
				require.NoError(t, it.After(use))
				it.End()
				st := eng.Stats()
				assert.Positive(t, st.SwapsOut)
				require.NoError(t, eng.Release(a))
				step("release", func() error { return eng.Release(b) }) // resident: its free records a guard event
				require.NoError(t, hd.SyncStream(eng.ComputeStream()))
				st = eng.Stats()
				assert.Zero(t, st.DeviceBytes, "device memory left held")
				assert.Zero(t, st.HostBytes, "pinned memory left held")
			})
		}
	}
}

// TestFaultsUnderAPolicy injects one fault into the copies, events and
// waits of the steps where a policy comes into force (parameters and
// optimizer state relocated to their places, copies on the policy's
// schedule, recomputes run) and of a STABLE one, under a policy of swaps
// and under one of recomputes (a slow link): a step that fails names the
// fault, the host releases what the step made, the next steps run and read
// every byte as written, and once every tensor is released no device or
// pinned memory is left held.
func TestFaultsUnderAPolicy(t *testing.T) {
	const n, size = 6, 64 << 10
	limit := int64(n * size * 5)
	for _, c := range []struct {
		name string
		link float64
	}{{"swaps", 0}, {"recomputes", 20e6}} {
		start := func(t *testing.T) (*faulty, *host.Device, *stepper) {
			hd, err := host.New(2 * limit)
			require.NoError(t, err)
			t.Cleanup(func() { hd.Close() })
			dev := &faulty{Device: hd}
			opts := []chameleon.Option{chameleon.WithMemoryLimit(limit), chameleon.WithDetection(quick()),
				chameleon.WithSyncPlanning(true), chameleon.WithMinSwapBytes(4096), chameleon.WithMeasuredTimes(false)}
			if c.link > 0 {
				opts = append(opts, chameleon.WithLinkBandwidth(c.link))
			}
			s := newStepperOn(t, hd, dev, n, size, opts...)
			s.recompute, s.actX = true, 3
			return dev, hd, s
		}
		// A run with no fault: where the policy comes into force, and what
		// it does.
		_, _, s := start(t)
		first := -1
		var swaps, recomputes int64
		for iter := range 10 {
			r, err := s.step(iter, true)
			require.NoError(t, err)
			if first < 0 && r.SwapsOut+r.Recomputes > 0 {
				first = iter
			}
			swaps, recomputes = swaps+r.SwapsOut, recomputes+r.Recomputes
		}
		require.GreaterOrEqual(t, first, 1, "%s: a policy came into force", c.name)
		t.Logf("%s: %d swaps, %d recomputes in 10 steps, the policy in force from step %d", c.name, swaps, recomputes, first)
		switch {
		case policyRace:
			// The warm-up's evictions, which the profile records, follow
			// the detector's scheduling: the policy may differ.
			require.Positive(t, swaps+recomputes, "%s: the policy moves something", c.name)
		case c.link > 0:
			require.Positive(t, recomputes, "%s: the policy recomputes", c.name)
		default:
			require.Positive(t, swaps, "%s: the policy swaps", c.name)
		}
		require.Positive(t, s.eng.Stats().Relocated, "%s: parameters moved to their places", c.name)

		failed := map[string]int{}
		nths, ats := []int{1, 4, 16}, []int{first - 1, first, first + 3}
		if policyRace {
			nths, ats = []int{1}, []int{first} // each case is ten times slower there
		}
		for _, method := range []string{"CopyD2H", "CopyH2D", "CopyD2D", "Record", "StreamWait", "NewEvent"} {
			for _, nth := range nths {
				for _, at := range ats {
					t.Run(fmt.Sprintf("%s/%s#%d at step %d", c.name, method, nth, at), func(t *testing.T) {
						dev, hd, s := start(t)
						for iter := range at + 4 {
							if iter == at {
								dev.arm(method, nth)
							}
							_, err := s.step(iter, true)
							fired := dev.fired
							dev.arm("", 0)
							if err != nil {
								require.True(t, fired, "step %d failed with no fault: %v", iter, err)
								require.ErrorIs(t, err, errInjected)
								failed[method]++
							}
						}
						for _, l := range [][]*chameleon.Tensor{s.params, s.m, s.v} {
							for _, x := range l {
								s.read(x)
								require.NoError(t, s.eng.Release(x))
							}
						}
						require.NoError(t, hd.SyncStream(s.eng.ComputeStream()))
						st := s.eng.Stats()
						assert.Zero(t, st.DeviceBytes, "device memory left held")
						assert.Zero(t, st.HostBytes, "pinned memory left held")
					})
				}
			}
		}
		t.Logf("%s: steps failed by a fault, by method: %v", c.name, failed)
		if policyRace {
			continue
		}
		for _, m := range []string{"Record", "NewEvent", "StreamWait"} {
			assert.Positive(t, failed[m], "%s: no %s fault made a step fail", c.name, m)
		}
		if c.link == 0 {
			assert.Positive(t, failed["CopyD2H"]+failed["CopyH2D"], "%s: no copy fault made a step fail", c.name)
		}
	}
}

// TestNewTensorRefusesImpossibleSizes: a size the limit cannot hold is an
// error naming it, never an overflow in the allocator's rounding.
func TestNewTensorRefusesImpossibleSizes(t *testing.T) {
	hd, err := host.New(1 << 20)
	require.NoError(t, err)
	defer hd.Close()
	eng, err := chameleon.New(hd, chameleon.WithMemoryLimit(1<<20))
	require.NoError(t, err)
	defer eng.Close()
	for _, size := range []int64{0, -1, 1<<20 + 1, 1<<63 - 1, 1<<63 - 100} {
		_, err := eng.NewTensor(size, chameleon.Activation, "uint8", []int64{size})
		assert.ErrorContains(t, err, fmt.Sprintf("tensor of %d bytes", size))
	}
	tn, err := eng.NewTensor(1<<20, chameleon.Activation, "uint8", []int64{1 << 20})
	require.NoError(t, err, "the limit itself fits")
	require.NoError(t, eng.Release(tn))
}
