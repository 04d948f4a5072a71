package mre_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/internal/testtraces"
	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/plan"
	"github.com/chameleon-go/chameleon/trace"
)

// hoistedQuarter is the plan input of the public trace name's step with
// the optimizer in the backward (trace.SplitTrace, memory.HoistTrace) at
// 25% of its peak, and the options that plan it with recompute and its
// kernel times; pre is the step prepared for planning.
func hoistedQuarter(t *testing.T, name string) (plan.Input, []plan.Option, *plan.Result) {
	t.Helper()
	tr := testtraces.Read(t, name+".jsonl.gz")
	kern, err := trace.ReadKernelsFile(testtraces.Path(t, name+".kernels.json.gz"))
	require.NoError(t, err)
	k := slices.IndexFunc(tr.Iterations, layer.FromKernels(kern).Matches)
	require.GreaterOrEqual(t, k, 0, "the kernel times time an iteration")
	split, origins := trace.SplitTrace(tr)
	hoisted, horigins := memory.HoistTrace(split, origins)
	kh, err := kern.Split(horigins[k])
	require.NoError(t, err)
	in := plan.Input{Iter: hoisted.Iterations[k], LiveOut: memory.LiveOutFromTrace(hoisted, k)}
	opts := []plan.Option{plan.WithEstimator(layer.FromKernels(kh)), plan.WithRecordedCurve(), plan.WithRecompute(mre.Recomputable)}
	pre, err := plan.Prepare(in, opts...)
	require.NoError(t, err)
	in.Limit = slices.Max(pre.Curve) / 4
	return in, opts, pre
}

// TestRetimeMovesWaitingCopiesWhereMemoryHasRoom plans llama7b-8l's step with
// the optimizer in the backward (trace.SplitTrace, memory.HoistTrace) at
// 25% of its peak with recompute and its kernel times, with and without
// the retiming pass: in the plan itself (the byte count alone) and, laid
// out in pages, once the layout is known (plan.Make). The pass moves only
// when each swap frees its memory and when it brings it back; the plan it
// leaves meets the same limit (laid out, where the plans are judged moved,
// a higher one may fit), its blocks fit, and here, where the
// optimizer state written in the backward queues on the link while memory
// has room, it is faster by more than a tenth of the time the copies made
// compute wait.
func TestRetimeMovesWaitingCopiesWhereMemoryHasRoom(t *testing.T) {
	in, opts, pre := hoistedQuarter(t, "llama7b-8l-bf16")

	for _, laid := range []bool{false, true} {
		t.Run(fmt.Sprintf("layout=%v", laid), func(t *testing.T) {
			opts := slices.Clone(opts)
			if !laid {
				opts = append(opts, plan.WithoutLayout())
			}
			before, err := plan.Make(in, append(opts, plan.WithPlanOptions(mre.WithoutRetime(), mre.WithoutWriteBack()))...)
			require.NoError(t, err)
			after, err := plan.Make(in, append(opts, plan.WithPlanOptions(mre.WithoutWriteBack()))...)
			require.NoError(t, err)
			b, a := before.Policy, after.Policy
			require.Positive(t, b.Sim.StallUS, "the plan the pass starts from waits for copies")
			if laid && after.Planned != before.Planned {
				// Laid out, plans are judged moved: a higher limit whose
				// blocks fit only once moved may be kept. It fits and
				// runs faster; its swaps are another plan's.
				assert.Greater(t, after.Planned, before.Planned)
				assert.True(t, after.Layout.Fits(), "the moved plan's blocks fit")
				assert.Less(t, after.Exec.IterationUS, before.Exec.IterationUS-b.Sim.StallUS/10)
				t.Logf("laid out at %d bytes moved, %d as planned: %.2f -> %.2f ms", after.Planned, before.Planned,
					before.Exec.IterationUS/1e3, after.Exec.IterationUS/1e3)
				return
			}
			require.Equal(t, before.Planned, after.Planned)
			require.Len(t, a.Swaps, len(b.Swaps))
			moved := 0
			for x, w := range a.Swaps {
				v := b.Swaps[x]
				require.Equal(t, []any{v.Tensor, v.Bytes, v.Out, v.Use, v.NoCopyOut}, []any{w.Tensor, w.Bytes, w.Out, w.Use, w.NoCopyOut}, "swap %d", x)
				require.NoError(t, w.Validate(len(pre.Curve)), "swap %d", x)
				assert.GreaterOrEqual(t, w.Free, v.Free, "swap %d frees no earlier", x)
				if w.Free != v.Free || w.In != v.In {
					moved++
				}
			}
			assert.Positive(t, moved)
			assert.Equal(t, b.Recomputes, a.Recomputes)
			assert.LessOrEqual(t, a.Sim.Peak, after.Planned)
			if laid {
				assert.True(t, after.Layout.Fits(), "the moved plan's blocks fit")
			}
			assert.Less(t, after.Exec.IterationUS, before.Exec.IterationUS-b.Sim.StallUS/10,
				"retimed %.2f ms, before %.2f ms with %.2f ms of waits", after.Exec.IterationUS/1e3, before.Exec.IterationUS/1e3, b.Sim.StallUS/1e3)
			t.Logf("retimed %d of %d swaps: %.2f -> %.2f ms (waits %.2f -> %.2f ms)", moved, len(a.Swaps),
				before.Exec.IterationUS/1e3, after.Exec.IterationUS/1e3, b.Sim.StallUS/1e3, a.Sim.StallUS/1e3)
		})
	}
}
