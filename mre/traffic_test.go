package mre

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPackGapsAgainstBruteForce: on small lines of ops, packGaps keeps as
// many bytes as the best choice of whole bytes, found by trying every one
// (cut into bytes the packing's constraint matrix is an interval matrix,
// so the best fractional packing is a whole one).
func TestPackGapsAgainstBruteForce(t *testing.T) {
	short := 0
	for seed := range 300 {
		r := rand.New(rand.NewPCG(uint64(seed), 33))
		n := 3 + r.IntN(6)
		room := make([]int64, n)
		for i := range room {
			room[i] = int64(r.IntN(5))
		}
		var gaps []gap
		var units []gap // each byte of each gap
		for len(units) < 12 {
			from := r.IntN(n)
			to := from + r.IntN(n-from)
			g := gap{from, to, int64(1 + r.IntN(3))}
			gaps = append(gaps, g)
			for range g.bytes {
				units = append(units, gap{from, to, 1})
			}
		}
		var best int64
		used := make([]int64, n)
		for set := range 1 << len(units) {
			clear(used)
			var kept int64
			ok := true
			for u := range units {
				if set&(1<<u) == 0 {
					continue
				}
				kept++
				for op := units[u].from; op <= units[u].to; op++ {
					used[op]++
					ok = ok && used[op] <= room[op]
				}
			}
			if ok {
				best = max(best, kept)
			}
		}
		got := packGaps(room, gaps)
		require.Equal(t, best, got, "seed %d: room %v gaps %v", seed, room, gaps)
		if best < int64(len(units)) {
			short++
		}
	}
	assert.Greater(t, short, 200, "instances where not every gap fits")
}

// TestTrafficBoundUnderPlans: on llama16-bf16, the planner's plans, swaps
// alone and with recomputes, copy at least TrafficBound in; the bound is
// zero where the curve fits, positive below, and falls as the limit rises.
func TestTrafficBoundUnderPlans(t *testing.T) {
	in := benchInput(t, "llama16-bf16.jsonl.gz", 1)
	peak := in.Limit
	rc := Recomputable(in.Model.Iter)
	assert.Zero(t, TrafficBound(in), "at the peak")
	last := map[bool]int64{false: 0, true: 0}
	for _, pct := range []int64{90, 70, 50, 40} {
		for _, recompute := range []bool{false, true} {
			in := in
			in.Limit = peak * pct / 100
			if recompute {
				in.Recomputable = rc
			}
			name := fmt.Sprintf("%d%%, recompute %v", pct, recompute)
			b := TrafficBound(in)
			assert.GreaterOrEqual(t, b, last[recompute], "%s: the bound rose as the limit fell", name)
			last[recompute] = b
			pol, err := Plan(in)
			if err != nil {
				t.Logf("%s: bound %d MiB, no plan: %v", name, b>>20, err)
				continue
			}
			t.Logf("%s: bound %d MiB, the plan copies %d MiB in", name, b>>20, pol.Sim.BytesH2D>>20)
			assert.GreaterOrEqual(t, pol.Sim.BytesH2D, b, "%s: the plan copies less than the bound", name)
		}
	}
	assert.Positive(t, last[false], "swaps alone at 40%")
	assert.Positive(t, last[true], "with recomputes at 40%")
	assert.LessOrEqual(t, last[true], last[false], "recomputes drop what would cross the link")
}
