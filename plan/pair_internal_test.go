package plan

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/plan/place"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// TestBlocksPairAValueSwappedBeforeItIsKept: a value a step makes, swaps
// out and brings back before its end, and keeps for the next step (a
// gradient the optimizer reads that the next forward reads again), is in
// the place it came back to when the next step begins, where that step
// frees it: its last piece and the value the step before kept are one
// block across the end, though the two values' whole lives cross.
func TestBlocksPairAValueSwappedBeforeItIsKept(t *testing.T) {
	const n, size = 10, 1024
	kept := &trace.Tensor{ID: 1, Bytes: size, Kind: trace.KindActivation} // the one the step before kept
	made := &trace.Tensor{ID: 2, Bytes: size, Kind: trace.KindActivation} // this step's
	m := &memory.Model{Curve: make([]int64, n), Lifetimes: []memory.Lifetime{
		{Tensor: kept, Bytes: size, Alloc: -1, Free: 6, Uses: []int32{0, 5}, LiveIn: true},
		{Tensor: made, Bytes: size, Alloc: 2, Free: n, Uses: []int32{2, 8}, LiveOut: true},
	}}
	swap := simulate.Swap{Tensor: made.ID, Bytes: size, Out: 2, Free: 3, In: 7, Use: 8}
	bs := Blocks(&Result{Model: m, Curve: m.Curve, Policy: &mre.Policy{Swaps: []simulate.Swap{swap}}})

	require.Len(t, bs, 2, "the made value's two places; none for the kept one")
	assert.Equal(t, Block{Size: size, Life: place.Once(2, 3), Tensor: made.ID, Kind: Made, Op: 2}, bs[0])
	assert.Equal(t, Block{Size: size, Tensor: made.ID, Kind: SwapIn, Op: 7,
		Life: place.Life{N: 2, IV: [2]place.Span{{From: 7, To: n}, {From: 0, To: 6}}}}, bs[1],
		"where it came back to, into the next step, which frees it where the kept one is freed")

	// Brought back before the kept one is freed, the two are two places.
	swap.In, swap.Use = 4, 5
	bs = Blocks(&Result{Model: m, Curve: m.Curve, Policy: &mre.Policy{Swaps: []simulate.Swap{swap}}})
	require.Len(t, bs, 3)
	assert.Equal(t, Entry, bs[0].Kind)
	assert.Equal(t, place.Once(0, 6), bs[0].Life)
	assert.Equal(t, place.Once(4, n), bs[2].Life)
}
