package chameleon_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/host"
)

// TestEvictorIsASeam: a host's own forced-eviction heuristic chooses what
// an allocation that does not fit swaps out; what it returns is checked
// (out of range, unmovable and repeated indices are ignored), and the
// tensor it chose comes back byte-identical at its use.
func TestEvictorIsASeam(t *testing.T) {
	const size = 96 << 10
	hd, err := host.New(1 << 20)
	require.NoError(t, err)
	defer hd.Close()
	var asked int
	var chose device.DevPtr
	// The most recently used movable tensor, not the allocator's cheapest
	// window, plus indices that must be ignored.
	mru := chameleon.EvictorFunc(func(want int64, resident []device.Resident, window func() []int) []int {
		asked++
		best := -1
		for i, r := range resident {
			if r.Movable && (best < 0 || r.Age > resident[best].Age) {
				best = i
			}
		}
		if best < 0 {
			return window()
		}
		chose = resident[best].Ptr
		return []int{-1, best, best, len(resident) + 5}
	})
	eng, err := chameleon.New(hd, chameleon.WithMemoryLimit(256<<10), chameleon.WithEvictor(mru))
	require.NoError(t, err)
	defer eng.Close()
	it := eng.Begin()
	var bAt device.DevPtr
	fill := func(seed byte) (*chameleon.Tensor, []byte) {
		tn, err := eng.NewTensor(size, chameleon.Activation, "uint8", []int64{size})
		require.NoError(t, err)
		want := bytes.Repeat([]byte{seed}, size)
		op := &chameleon.Op{Name: "fill", Out: []*chameleon.Tensor{tn}}
		require.NoError(t, it.Before(op))
		require.NoError(t, hd.WriteDevice(tn.Ptr(), want))
		if seed == 2 {
			bAt = tn.Ptr()
		}
		require.NoError(t, it.After(op))
		return tn, want
	}
	a, wa := fill(1)
	b, wb := fill(2) // b used last
	c, _ := fill(3)  // does not fit: the evictor picks b
	assert.Positive(t, asked)
	assert.Equal(t, bAt, chose, "the most recently used went, as the evictor said")
	for _, x := range []struct {
		tn   *chameleon.Tensor
		want []byte
	}{{a, wa}, {b, wb}} {
		op := &chameleon.Op{Name: "read", In: []*chameleon.Tensor{x.tn}}
		require.NoError(t, it.Before(op))
		got := make([]byte, size)
		require.NoError(t, hd.ReadDevice(got, x.tn.Ptr()))
		assert.True(t, bytes.Equal(x.want, got), "tensor %d came back changed", x.tn.ID())
		require.NoError(t, it.After(op))
		if x.tn == a {
			assert.Zero(t, eng.Stats().SwapsIn, "a stayed: the allocator's window would have evicted it")
		}
	}
	assert.Equal(t, int64(1), eng.Stats().SwapsIn, "b went and came back")
	require.NoError(t, it.End().Err)
	for _, tn := range []*chameleon.Tensor{a, b, c} {
		require.NoError(t, eng.Release(tn))
	}
}
