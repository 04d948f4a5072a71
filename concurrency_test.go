package chameleon_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device/host"
)

// TestStaleHandle: a released handle is never handed out again, so a stale
// copy of it can neither free nor reach the tensors made after it.
func TestStaleHandle(t *testing.T) {
	dev, err := host.New(1 << 20)
	require.NoError(t, err)
	defer dev.Close()
	eng, err := chameleon.New(dev, chameleon.WithMemoryLimit(256<<10))
	require.NoError(t, err)
	defer eng.Close()

	old, err := eng.NewTensor(4096, chameleon.Activation, "uint8", []int64{4096})
	require.NoError(t, err)
	stale := old
	require.NoError(t, eng.Release(old))
	// Many allocations after the release: none may get the released handle.
	var fresh []*chameleon.Tensor
	for range 200 {
		x, err := eng.NewTensor(1024, chameleon.Activation, "uint8", []int64{1024})
		require.NoError(t, err)
		require.NotSame(t, stale, x, "a released handle came back from NewTensor")
		fresh = append(fresh, x)
	}
	before := eng.Stats()
	assert.NoError(t, eng.Release(stale), "releasing again does nothing")
	assert.Equal(t, before, eng.Stats(), "the stale Release freed nothing")

	it := eng.Begin()
	assert.ErrorContains(t, it.Before(&chameleon.Op{Name: "mm", In: []*chameleon.Tensor{stale}}), "released tensor")
	op := chameleon.Op{Name: "mm", In: fresh[:1]}
	require.NoError(t, it.Before(&op), "the tensors made after it are untouched")
	_ = fresh[0].Ptr()
	require.NoError(t, it.After(&op))
	require.NoError(t, it.End().Err)
	for _, x := range fresh {
		require.NoError(t, eng.Release(x))
	}
	s := eng.Stats()
	assert.Zero(t, s.DeviceBytes, "every byte came back")
	assert.Zero(t, s.HostBytes)
}

// TestConcurrentCalls: NewTensor, Release and Stats from several goroutines
// while one goroutine runs the iterations. Under -race this is the check
// that every call serializes; without it, the bytes still add up.
func TestConcurrentCalls(t *testing.T) {
	dev, err := host.New(8 << 20)
	require.NoError(t, err)
	defer dev.Close()
	eng, err := chameleon.New(dev, chameleon.WithMemoryLimit(4<<20))
	require.NoError(t, err)
	defer eng.Close()

	const workers, rounds = 4, 300
	var wg sync.WaitGroup
	errs := make(chan error, workers+1)
	for w := range workers {
		wg.Go(func() {
			var held []*chameleon.Tensor
			for r := range rounds {
				x, err := eng.NewTensor(int64(512*(1+(w+r)%7)), chameleon.Activation, "uint8", nil)
				if err != nil {
					errs <- fmt.Errorf("worker %d round %d: %w", w, r, err)
					return
				}
				held = append(held, x)
				if len(held) > 4 {
					if err := eng.Release(held[0]); err != nil {
						errs <- err
						return
					}
					// A second Release of the same handle, as a careless
					// caller would: it must not free another worker's tensor.
					if err := eng.Release(held[0]); err != nil {
						errs <- err
						return
					}
					held = held[1:]
				}
				_ = eng.Stats()
			}
			for _, x := range held {
				if err := eng.Release(x); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Go(func() {
		// The training loop: ops whose tensors the workers' allocations
		// must not move while the op runs.
		a, err := eng.NewTensor(64<<10, chameleon.Activation, "uint8", nil)
		if err != nil {
			errs <- err
			return
		}
		for range 20 {
			it := eng.Begin()
			for range 10 {
				b, err := eng.NewTensor(64<<10, chameleon.Activation, "uint8", nil)
				if err != nil {
					errs <- err
					return
				}
				op := chameleon.Op{Name: "add", In: []*chameleon.Tensor{a}, Out: []*chameleon.Tensor{b}}
				if err := it.Before(&op); err != nil {
					errs <- err
					return
				}
				if a.Ptr() == 0 || b.Ptr() == 0 {
					errs <- fmt.Errorf("an op's tensor has no address")
				}
				if err := it.After(&op); err != nil {
					errs <- err
					return
				}
				if err := eng.Release(a); err != nil {
					errs <- err
					return
				}
				a = b
			}
			if r := it.End(); r.Err != nil {
				errs <- r.Err
				return
			}
		}
		if err := eng.Release(a); err != nil {
			errs <- err
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	s := eng.Stats()
	assert.Zero(t, s.DeviceBytes, "device bytes still handed out")
	assert.Zero(t, s.HostBytes, "pinned bytes still in use")
}

// TestNewTensorInsideOpKeepsItsTensors: a tensor allocated while an op runs
// (between Before and After, from this goroutine or another) never moves
// that op's tensors, even when it is the cheapest to move.
func TestNewTensorInsideOpKeepsItsTensors(t *testing.T) {
	dev, err := host.New(1 << 20)
	require.NoError(t, err)
	defer dev.Close()
	eng, err := chameleon.New(dev, chameleon.WithMemoryLimit(256<<10))
	require.NoError(t, err)
	defer eng.Close()
	f, err := eng.NewTensor(96<<10, chameleon.Activation, "uint8", nil)
	require.NoError(t, err)
	a, err := eng.NewTensor(64<<10, chameleon.Activation, "uint8", nil)
	require.NoError(t, err)
	it := eng.Begin()
	op := chameleon.Op{Name: "mm", In: []*chameleon.Tensor{a}}
	require.NoError(t, it.Before(&op))
	// 128 KiB needs one of the two out; a is the cheaper, but its op runs.
	x, err := eng.NewTensor(128<<10, chameleon.Activation, "uint8", nil)
	require.NoError(t, err)
	assert.NotPanics(t, func() { _ = a.Ptr() }, "the op's input was moved while the op ran")
	assert.Equal(t, int64(96<<10), eng.Stats().SwappedOutBytes, "f went out instead")
	require.NoError(t, it.After(&op))
	require.NoError(t, it.End().Err)
	require.NoError(t, eng.Release(x))
	require.NoError(t, eng.Release(a))
	require.NoError(t, eng.Release(f))
	assert.Zero(t, eng.Stats().DeviceBytes)
}

// TestHintsOnTensorsMadeDuringAnOp: a tensor another goroutine makes while
// an op runs is not the op's: Fill and Evict of it are served at once,
// while those of the op's own tensors wait for its After.
func TestHintsOnTensorsMadeDuringAnOp(t *testing.T) {
	dev, err := host.New(1 << 20)
	require.NoError(t, err)
	defer dev.Close()
	eng, err := chameleon.New(dev, chameleon.WithMemoryLimit(256<<10))
	require.NoError(t, err)
	defer eng.Close()
	a, err := eng.NewTensor(16<<10, chameleon.Persistent, "uint8", nil)
	require.NoError(t, err)
	it := eng.Begin()
	op := chameleon.Op{Name: "mm", In: []*chameleon.Tensor{a}}
	require.NoError(t, it.Before(&op))
	errs := make(chan error, 3)
	go func() {
		w, err := eng.NewTensor(16<<10, chameleon.Persistent, "uint8", nil)
		if err != nil {
			for range 3 {
				errs <- err
			}
			return
		}
		errs <- eng.Fill(w, make([]byte, 16<<10))
		errs <- eng.Evict(w)
		errs <- eng.Release(w)
	}()
	for range 3 {
		assert.NoError(t, <-errs, "a tensor the op does not list")
	}
	assert.ErrorContains(t, eng.Evict(a), "the op under way lists it")
	assert.ErrorContains(t, eng.Fill(a, make([]byte, 16<<10)), "the op under way lists it")
	require.NoError(t, it.After(&op))
	require.NoError(t, it.End().Err)
	require.NoError(t, eng.Evict(a))
	require.NoError(t, eng.Release(a))
}
