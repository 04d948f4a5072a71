package mre

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// twice is an iteration where activation 1 (100 MiB) is made by op 0 and
// used again by ops 4 and 8, idle over two gaps, each holding one op over
// the limit; op 4 writes it in place when written is set.
func twice(written bool) (*memory.Model, []int64, []float64) {
	it := &trace.Iteration{Tensors: map[trace.TensorID]*trace.Tensor{
		1: {ID: 1, Bytes: 100 * mib, Kind: trace.KindActivation},
		2: {ID: 2, Bytes: mib, Kind: trace.KindActivation},
	}}
	for t := range 10 {
		op := trace.Op{Seq: t, Name: "aten::mul", Phase: trace.PhaseBackward, Mem: -1, In: []trace.TensorID{2}}
		switch t {
		case 0:
			op.Phase, op.Out = trace.PhaseForward, []trace.TensorID{1, 2}
		case 4:
			op.In = append(op.In, 1)
			if written {
				op.Name, op.Out = "aten::add_", []trace.TensorID{1}
			}
		case 8:
			op.In = append(op.In, 1)
		}
		it.Ops = append(it.Ops, op)
	}
	curve := make([]int64, 10)
	times := make([]float64, 10)
	for t := range curve {
		curve[t], times[t] = 110*mib, 5000 // 100 MiB crosses in ~1.9 ms
	}
	curve[2], curve[6] = 200*mib, 200*mib
	return memory.Build(it, nil), curve, times
}

// A tensor swapped twice with no write between its first copy back and
// its second swap-out has a current host copy: the second swap releases
// the device memory and copies nothing. A write in between makes the host
// copy stale, and the second swap copies out again.
func TestSwappedTwice(t *testing.T) {
	for _, written := range []bool{false, true} {
		m, curve, times := twice(written)
		pol, err := Plan(Input{Model: m, Curve: curve, OpTimes: times, Limit: 150 * mib})
		require.NoError(t, err)
		require.Len(t, pol.Swaps, 2, "written %v", written)
		first, second := pol.Swaps[0], pol.Swaps[1]
		require.Equal(t, []int{0, 4}, []int{first.Out, second.Out})
		assert.False(t, first.NoCopyOut, "made by the iteration: its first swap copies out")
		assert.Equal(t, !written, second.NoCopyOut, "written %v", written)
		want := int64(200 * mib)
		if !written {
			want = 100 * mib
		}
		assert.Equal(t, want, pol.Sim.BytesD2H, "written %v", written)
		assert.Equal(t, int64(200*mib), pol.Sim.BytesH2D)
		assert.LessOrEqual(t, pol.Sim.Peak, int64(150*mib))
	}
}

// MarkReadOnly over a swap that wraps the iteration: a parameter brought
// back at the start, swapped out after its forward use and back for its
// backward, then out again across the boundary. Each swap-out is free when
// no op wrote the tensor since the copy back before it; a frozen one
// always is.
func TestMarkReadOnlyWrap(t *testing.T) {
	for _, c := range []struct {
		name                string
		writeAt             int // -1: none
		frozen              bool
		wantInner, wantWrap bool
	}{
		{"read only", -1, false, true, true},
		{"written before the inner swap", 1, false, false, true},
		{"written after it came back", 7, false, true, false},
		{"frozen", -1, true, true, true},
	} {
		it := &trace.Iteration{Tensors: map[trace.TensorID]*trace.Tensor{
			1: {ID: 1, Bytes: 10 * mib, Kind: trace.KindParam, Frozen: c.frozen},
		}}
		for x := range 10 {
			op := trace.Op{Seq: x, Name: "aten::mm", Mem: -1}
			if x == 1 || x == 2 || x == 6 || x == 7 {
				op.In = []trace.TensorID{1}
			}
			if x == c.writeAt {
				op.Name, op.Out = "aten::add_", []trace.TensorID{1}
			}
			it.Ops = append(it.Ops, op)
		}
		m := memory.Build(it, nil)
		swaps := []simulate.Swap{
			{Tensor: 1, Bytes: 10 * mib, Out: 2, Free: 3, In: 5, Use: 6},
			{Tensor: 1, Bytes: 10 * mib, Out: 7, Free: 8, In: 0, Use: 1},
		}
		MarkReadOnly(m, swaps)
		assert.Equal(t, c.wantInner, swaps[0].NoCopyOut, c.name)
		assert.Equal(t, c.wantWrap, swaps[1].NoCopyOut, c.name)
	}
	// A view lists its storage among its outputs and writes nothing.
	it := &trace.Iteration{Tensors: map[trace.TensorID]*trace.Tensor{1: {ID: 1, Bytes: mib, Kind: trace.KindParam}}}
	it.Ops = []trace.Op{{Name: "aten::t", In: []trace.TensorID{1}, Out: []trace.TensorID{1}}, {Name: "aten::add_", In: []trace.TensorID{1}, Out: []trace.TensorID{1}}}
	assert.False(t, Writes(it, 0, 1))
	assert.True(t, Writes(it, 1, 1))
	// An in-place op that lists what it updates among its inputs alone.
	it.Ops = append(it.Ops, trace.Op{Name: "aten::_fused_adamw_", In: []trace.TensorID{1}})
	assert.True(t, Writes(it, 2, 1))
}

// The bounds count frozen bytes as leaving with no copy out: a curve over
// the limit only while frozen weights sit idle needs no copy out at all.
func TestBoundsKept(t *testing.T) {
	curve := []int64{100, 200, 200, 100}
	d := []float64{10, 10, 10, 10}
	kept := []int64{0, 100, 100, 0}
	plain := LowerBound(curve, 100, d, 1e6, 1e6) // 100 bytes at 1 B/µs: 100 µs each way
	ro := LowerBoundKept(curve, 100, d, 1e6, 1e6, kept)
	assert.Greater(t, plain.OverheadUS, ro.OverheadUS)
	assert.Equal(t, -1, ro.OutOp)
	assert.InDelta(t, 100, StreamingBound(curve, 100, d, 1e6, 1e6, kept), 1e-9)
	assert.InDelta(t, 40, StreamingBound(curve, 200, d, 1e6, 1e6, kept), 1e-9)
}
