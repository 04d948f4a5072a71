package cuda_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device/cuda"
	"github.com/chameleon-go/chameleon/trace"
)

// TestEngineMappedFake runs the Engine on the fake CUDA device with page
// mapping: a forward pass keeps activations of sizes that are no multiple of
// the page, a backward pass reads them in reverse, under a limit below their
// sum, so the Engine swaps them out and back. Every byte read back must be
// the byte written, and the Engine's allocator must have mapped its pages
// through the driver calls and given them all back at Close.
func TestEngineMappedFake(t *testing.T) {
	d, vmm := cuda.NewMappedFake(t)
	defer d.Close()
	const page = 64 << 10
	const limit = 16 * page
	eng, err := chameleon.New(d, chameleon.WithMemoryLimit(limit))
	require.NoError(t, err)
	assert.Positive(t, vmm.Creates(), "the Engine's allocator maps pages")
	assert.EqualValues(t, 1, vmm.Reservations())

	sizes := []int64{150 << 10, 70 << 10, 230 << 10, 90 << 10, 310 << 10, 50 << 10, 170 << 10, 260 << 10, 120 << 10}
	fill := func(tag, i, it int) []byte {
		b := make([]byte, sizes[i])
		for j := range b {
			b[j] = byte(tag*31 + i*7 + it*13 + j)
		}
		return b
	}
	var total int64
	for _, s := range sizes {
		total += s
	}
	require.Greater(t, total, int64(limit), "the activations do not fit together")

	var swaps int64
	for iter := range 8 {
		it := eng.Begin()
		acts := make([]*chameleon.Tensor, len(sizes))
		for i, s := range sizes {
			x, err := eng.NewTensor(s, chameleon.Activation, "uint8", []int64{s})
			require.NoError(t, err)
			var in []*chameleon.Tensor
			if i > 0 {
				in = []*chameleon.Tensor{acts[i-1]}
			}
			op := &chameleon.Op{Name: "aten::linear", Module: fmt.Sprintf("layers.%d", i), Phase: trace.PhaseForward, In: in, Out: []*chameleon.Tensor{x}}
			require.NoError(t, it.Before(op))
			require.NoError(t, d.WriteDevice(x.Ptr(), fill(1, i, iter)))
			require.NoError(t, it.After(op))
			acts[i] = x
		}
		for i := len(sizes) - 1; i >= 0; i-- {
			op := &chameleon.Op{Name: "aten::linear_backward", Module: fmt.Sprintf("layers.%d", i), Phase: trace.PhaseBackward, In: []*chameleon.Tensor{acts[i]}}
			require.NoError(t, it.Before(op))
			got := make([]byte, sizes[i])
			require.NoError(t, d.ReadDevice(got, acts[i].Ptr()))
			require.True(t, bytes.Equal(fill(1, i, iter), got), "iteration %d: activation %d came back changed", iter, i)
			require.NoError(t, it.After(op))
			require.NoError(t, eng.Release(acts[i]))
		}
		res := it.End()
		require.NoError(t, res.Err)
		st := eng.Stats()
		assert.LessOrEqual(t, st.PeakDeviceBytes, int64(limit), "iteration %d", iter)
		swaps = st.SwapsOut
	}
	assert.Positive(t, swaps, "the limit forced swaps")
	st := eng.Stats()
	t.Logf("swaps out %d in %d, evictions %d, on demand %d; %d pages created", st.SwapsOut, st.SwapsIn, st.Evictions, st.OnDemandIn, vmm.Creates())
	require.NoError(t, eng.Close())
	assert.Zero(t, vmm.Reservations(), "Close releases the address space")
	assert.Zero(t, vmm.LiveHandles(), "and every page")
	assert.Zero(t, vmm.NetPushes())
}
