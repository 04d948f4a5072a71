package plan_test

import (
	"cmp"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/internal/testtraces"
	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/plan"
	"github.com/chameleon-go/chameleon/trace"
)

// TestLayoutHoldsThePlan lays out real plans, swap-only and with
// recomputes, at their deep cuts: at every op the blocks hold the bytes the
// simulated curve holds (so a swap's block ends where the simulation counts
// its memory free, after its copy out), and no more than the small values
// kept into the next step hold their places from its start; no two blocks
// share an address while both live, and the pages the layout needs fit the
// limit.
func TestLayoutHoldsThePlan(t *testing.T) {
	for _, c := range []struct {
		name      string
		pct       int64
		recompute bool
	}{
		{testtraces.Small, 85, false},
		{"gpt2-xl-24l.jsonl.gz", 46, true}, // its checkpointing peak
		{"qwen2-12l.jsonl.gz", 50, true},   // its checkpointing peak
		{"llama16-bf16.jsonl.gz", 45, true},
		{"llama16-bf16.jsonl.gz", 80, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if raceEnabled && c.name != testtraces.Small {
				t.Skip("the public traces' plans are slow under the race detector")
			}
			tr := testtraces.Read(t, c.name)
			in := plan.Input{Iter: tr.Iterations[1], LiveOut: memory.LiveOutFromTrace(tr, 1)}
			pre, err := plan.Prepare(in)
			require.NoError(t, err)
			in.Limit = pre.Model.Peak * c.pct / 100
			var opts []plan.Option
			if c.recompute {
				opts = append(opts, plan.WithRecompute(mre.Recomputable))
			}
			r, err := plan.Make(in, opts...)
			require.NoError(t, err)
			l := r.Layout
			require.NotNil(t, l)
			t.Logf("%d%%: planned for %.1f%% of the limit (%d tries), needs %.1f%% (%d pages touched, %d at most, of %d), %.1f%% overhead",
				c.pct, 100*float64(r.Planned)/float64(in.Limit), r.Tries, 100*float64(l.Need())/float64(in.Limit), l.Touched, l.Most, in.Limit/l.Page, r.Exec.OverheadPct())
			assert.True(t, l.Fits())
			assert.Zero(t, l.Unplaced)

			n := len(r.Curve)
			delta := make([]int64, n+1)
			var kept int64 // small values kept into the next step, held from its start
			for _, b := range l.Blocks {
				if b.Kind == plan.Made && b.Life.N == 2 && b.Life.IV[1].To == int32(b.Op) {
					assert.LessOrEqual(t, b.Size, max(l.Page, l.Budget>>10))
					kept += b.Size
				}
				require.GreaterOrEqual(t, b.Off, int64(0))
				for _, v := range b.Life.IV[:b.Life.N] {
					require.Less(t, v.From, v.To)
					delta[v.From] += b.Size
					delta[v.To] -= b.Size
				}
			}
			var live int64
			for op := range n {
				live += delta[op]
				require.GreaterOrEqual(t, live, r.Exec.Ops[op].Mem, "op %d", op)
				require.LessOrEqual(t, live, r.Exec.Ops[op].Mem+kept, "op %d", op)
			}

			// Each block says what takes it: the executor serves it by that.
			ins, rcs := map[int]int{}, map[int]int{}
			made := map[[2]int]bool{}
			for _, b := range l.Blocks {
				switch b.Kind {
				case plan.SwapIn:
					ins[b.Index]++
					assert.Equal(t, r.Swaps()[b.Index].In, b.Op)
				case plan.Recompute:
					rcs[b.Index]++
					assert.Equal(t, r.Recomputes()[b.Index].Before, b.Op)
				case plan.Made:
					k := [2]int{b.Op, b.Index}
					assert.False(t, made[k], "op %d makes two blocks of ordinal %d", b.Op, b.Index)
					made[k] = true
				}
			}
			for k, s := range r.Swaps() {
				if !s.Wraps() {
					assert.Equal(t, 1, ins[k], "swap %d comes back as one block", k)
				}
			}
			for k := range r.Recomputes() {
				assert.Equal(t, 1, rcs[k], "recompute %d makes one block", k)
			}

			byAddr := slices.Clone(l.Blocks)
			slices.SortFunc(byAddr, func(x, y plan.Block) int { return cmp.Compare(x.Off, y.Off) })
			for i, x := range byAddr {
				for _, y := range byAddr[i+1:] {
					if y.Off >= x.Off+x.Size {
						break
					}
					require.False(t, x.Life.Meets(y.Life), "blocks at %#x and %#x overlap while both live", x.Off, y.Off)
				}
			}
		})
	}
}

// TestEveryCopyBackHasItsPlace: in a laid-out plan, every swap's copy back
// is a block of its own (SwapIn, the swap's index) taken at the op the
// copy is issued at, which is where the Engine serves it; that includes a
// wrapping swap whose copy back is issued at the step's first op and a
// swap whose memory counts free at the op its copy back is issued at (an
// empty hole). Before, the first kind kept the block of the tensor live at
// entry, so its copy back had no place: on llama7b-8l-bf16 with its
// optimizer step split, at a quarter of its peak (1/256 scale), the
// embedding weight came back anywhere and took 13 places a step.
func TestEveryCopyBackHasItsPlace(t *testing.T) {
	if raceEnabled {
		t.Skip("the public traces' plans are slow under the race detector")
	}
	tr := testtraces.Read(t, "llama7b-8l-bf16.jsonl.gz")
	split, _ := trace.SplitTrace(tr)
	in := plan.Input{Iter: split.Iterations[1], LiveOut: memory.LiveOutFromTrace(split, 1)}
	opts := []plan.Option{plan.WithRecompute(mre.Recomputable), plan.WithRecordedCurve()}
	pre, err := plan.Prepare(in, opts...)
	require.NoError(t, err)
	in.Limit = slices.Max(pre.Curve) / 4
	r, err := plan.Make(in, opts...)
	require.NoError(t, err)
	require.True(t, r.Layout.Fits())
	at := map[int]plan.Block{}
	for _, b := range r.Layout.Blocks {
		if b.Kind == plan.SwapIn {
			_, dup := at[b.Index]
			assert.False(t, dup, "swap %d: one block", b.Index)
			at[b.Index] = b
		}
	}
	var atFirst, empty int
	for k, s := range r.Swaps() {
		b, ok := at[k]
		if !assert.True(t, ok, "swap %d (%+v): no block for its copy back", k, s) {
			continue
		}
		assert.Equal(t, s.Tensor, b.Tensor)
		assert.Equal(t, s.In, b.Op, "swap %d: taken where its copy back is issued", k)
		assert.Equal(t, int32(s.In), b.Life.IV[0].From)
		assert.GreaterOrEqual(t, b.Off, int64(0), "swap %d: placed", k)
		if s.Wraps() && s.In == 0 {
			atFirst++
		}
		if f := r.Exec.Freed[k]; f == s.In {
			empty++
		}
	}
	t.Logf("%d swaps, %d wrapping ones back at the first op, %d back at the op they are freed at", len(r.Swaps()), atFirst, empty)
	assert.Positive(t, atFirst+empty, "the case the test is for")
}
