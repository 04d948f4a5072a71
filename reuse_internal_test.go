package chameleon

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/simulate"
)

// TestReuseFromCopyEnd: placement may hand a swapped tensor's memory to
// others from the first op that starts once its simulated copy out is
// done, with a margin, and never later than the plan's Free; a swap freed
// when its copy is done (Free < 0), or one that copies nothing out, keeps
// the plan's Free.
func TestReuseFromCopyEnd(t *testing.T) {
	ops := make([]float64, 20)
	for i := range ops {
		ops[i] = 100 // µs
	}
	swaps := []simulate.Swap{
		// 1 MB at 1 GB/s: 1000 µs from the end of op 2 (300 µs), done
		// at 1300 µs; with the margin, 1550: op 16 starts at 1600.
		{Tensor: 1, Bytes: 1e6, Out: 2, Free: 18, In: 19, Use: 19},
		// Free before the copy is done: Free stays.
		{Tensor: 2, Bytes: 1e6, Out: 3, Free: 6, In: 19, Use: 19},
		{Tensor: 3, Bytes: 1e6, Out: 3, Free: -1, In: 19, Use: 19},
		{Tensor: 4, Bytes: 1e6, Out: 3, Free: 10, In: 19, Use: 19, NoCopyOut: true},
	}
	link := simulate.Link{D2H: 1e9, H2D: 1e9, D2HShared: 1e9, H2DShared: 1e9}
	ex, err := simulate.Run(simulate.Input{OpTimes: ops, Swaps: swaps, Link: link, Issue: simulate.Issue(swaps, nil)})
	require.NoError(t, err)
	p := &policy{schedule: schedule{swaps: swaps}}
	p.simulated(ex)
	done := ex.Out[0].End + copySlack*(ex.Out[0].End-ex.Out[0].Start)
	at := p.reuseFrom(0)
	assert.GreaterOrEqual(t, ex.Ops[at].Start, done, "reused before the copy and its margin are done")
	assert.Less(t, ex.Ops[at-1].Start, done, "the first op after them")
	assert.Less(t, at, swaps[0].Free)
	for k := 1; k < len(swaps); k++ {
		assert.Equal(t, swaps[k].Free, p.reuseFrom(int32(k)), "swap %d", k)
	}
	// Without a simulation (a policy loaded from a file), the plan's Free.
	q := &policy{schedule: schedule{swaps: swaps}}
	assert.Equal(t, swaps[0].Free, q.reuseFrom(0))
}
