package mre_test

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/plan"
	"github.com/chameleon-go/chameleon/simulate"
)

// TestWriteBackCopiesAtTheLastWrite plans llama16's step with the optimizer
// in the backward at 25% of its peak, with recompute and its kernel times,
// with and without write-backs. Where the plan writes back, each such swap
// copies out after an op that writes its tensor, with no op writing it from
// there to the swap's Out (round the iteration's end for a weight the
// previous step's optimizer wrote), and its memory is free from the op after
// Out. The write-backs take the weights the pieces write in the backward off
// the forward's link out, and the plan is faster, within the same limit.
func TestWriteBackCopiesAtTheLastWrite(t *testing.T) {
	in, opts, _ := hoistedQuarter(t, "llama16-bf16")
	opts = append(opts, plan.WithoutLayout())

	before, err := plan.Make(in, append(opts, plan.WithPlanOptions(mre.WithoutWriteBack()))...)
	require.NoError(t, err)
	after, err := plan.Make(in, opts...)
	require.NoError(t, err)
	it := in.Iter
	n := len(it.Ops)
	early := 0
	for x, s := range after.Policy.Swaps {
		require.NoError(t, s.Validate(n), "swap %d", x)
		if !s.Early {
			assert.Equal(t, 0, s.CopyAfter)
			continue
		}
		early++
		assert.False(t, s.NoCopyOut, "swap %d", x)
		assert.Equal(t, s.Out+1, s.Free, "swap %d: free from the op after its release", x)
		assert.True(t, mre.Writes(it, s.CopyAfter, s.Tensor), "swap %d: copied after op %d, which does not write it", x, s.CopyAfter)
		for op := (s.CopyAfter + 1) % n; op != s.Out; op = (op + 1) % n {
			require.False(t, mre.Writes(it, op, s.Tensor), "swap %d: op %d writes it after its write-back", x, op)
		}
		at, ok := mre.WriteBackAt(after.Model, after.Policy.Swaps, after.Policy.Recomputes, x)
		assert.True(t, ok, "swap %d", x)
		assert.Equal(t, s.CopyAfter, at, "swap %d", x)
	}
	require.Positive(t, early, "the plan writes back")
	wrapped := slices.ContainsFunc(after.Policy.Swaps, func(s simulate.Swap) bool { return s.EarlyWraps() })
	assert.True(t, wrapped, "weights the previous step's optimizer wrote are written back there")
	assert.LessOrEqual(t, after.Exec.Peak, in.Limit)
	assert.Less(t, after.Exec.IterationUS, before.Exec.IterationUS*0.98,
		"with write-backs %.2f ms, without %.2f ms", after.Exec.IterationUS/1e3, before.Exec.IterationUS/1e3)
	t.Logf("%d write-backs of %d swaps: %.2f -> %.2f ms (waits for copies out %.2f -> %.2f ms)", early, len(after.Policy.Swaps),
		before.Exec.IterationUS/1e3, after.Exec.IterationUS/1e3, before.Exec.WaitOutUS/1e3, after.Exec.WaitOutUS/1e3)
}
