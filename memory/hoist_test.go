package memory

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/internal/testtraces"
	"github.com/chameleon-go/chameleon/trace"
)

// TestHoistTraceKeepsTheModel: on the recorded traces whose optimizer step
// moves into the backward, the model of each hoisted iteration reads off
// its recorded memory (HoistTrace) what the split iteration's model reads
// off the recording: its curve is that memory at every op, a storage whose
// last use stayed put goes where it went (after the same op, or after its
// last use where that now comes later), and a gradient whose last use is a
// moved piece goes right after it (storages within the slack the model
// reads releases to aside). Taken as it was, the hoisted recorded
// memory made the model hold 64 MiB activations of llama7b-8l to the end of
// the step and give their releases to gradients (worst op error 1.48%).
func TestHoistTraceKeepsTheModel(t *testing.T) {
	for _, name := range []string{"llama16-bf16.jsonl.gz", "llama7b-8l-bf16.jsonl.gz"} {
		t.Run(name, func(t *testing.T) {
			tr, err := trace.ReadFile(testtraces.Path(t, name))
			require.NoError(t, err)
			split, origins := trace.SplitTrace(tr)
			h, horigins := HoistTrace(split, origins)
			for k := range h.Iterations {
				s, it := split.Iterations[k], h.Iterations[k]
				at := map[trace.Origin]int{}
				for i, o := range origins[k] {
					at[o] = i
				}
				from := make([]int, len(it.Ops))
				for i, o := range horigins[k] {
					from[i] = at[o]
				}
				ahead := make([]bool, len(from)) // run before an op it followed
				low := len(from)
				for i := len(from) - 1; i >= 0; i-- {
					ahead[i], low = from[i] > low, min(low, from[i])
				}
				ms := Build(s, LiveOutFromTrace(split, k))
				mh := Build(it, LiveOutFromTrace(h, k))
				var worst int64
				for i, op := range it.Ops {
					worst = max(worst, op.Mem-mh.Curve[i], mh.Curve[i]-op.Mem)
				}
				assert.LessOrEqual(t, worst, int64(releaseSlack), "iteration %d: the hoisted model's curve is its recorded memory", k)
				assert.LessOrEqual(t, mh.Peak, ms.Peak, "iteration %d", k)
				n := len(it.Ops)
				moved, early := 0, 0
				for i := range mh.Lifetimes {
					lh := &mh.Lifetimes[i]
					ls := ms.Lifetime(lh.Tensor.ID)
					require.NotNil(t, ls)
					u := lh.LastUse()
					if u < 0 || ls.Free >= n {
						assert.Equal(t, ls.Free, lh.Free, "iteration %d: storage %d", k, lh.Tensor.ID)
						continue
					}
					require.Equal(t, ls.LastUse(), from[u], "iteration %d: storage %d's last use", k, lh.Tensor.ID)
					if lh.Bytes <= releaseSlack {
						continue // within what the model reads releases to
					}
					if ahead[u] {
						moved++
						if ls.Free > ls.LastUse()+1 {
							early++
						}
						assert.Equal(t, u+1, lh.Free, "iteration %d: storage %d goes right after the moved piece that last used it", k, lh.Tensor.ID)
						continue
					}
					switch {
					case ls.Free <= ls.LastUse():
						assert.Equal(t, u, lh.Free, "iteration %d: storage %d, inside its last op", k, lh.Tensor.ID)
					case ls.Free == ls.LastUse()+1:
						assert.Equal(t, u+1, lh.Free, "iteration %d: storage %d, after its last op", k, lh.Tensor.ID)
					default:
						assert.Equal(t, from[lh.Free-1], ls.Free-1, "iteration %d: storage %d, after the op it went after", k, lh.Tensor.ID)
					}
				}
				assert.Positive(t, moved, "iteration %d: storages last used by a moved piece", k)
				assert.Positive(t, early, "iteration %d: gradients held to the step's end go in the backward", k)
			}
		})
	}
}

// TestLiveOutFromTraceGradientNotKept: what a backward makes and the next
// iteration first lists in its forward is another tensor in the same block
// (no forward reads a gradient), so it is not kept past the iteration; one
// the next backward lists first (a gradient accumulated into) is, and so
// is a value the forward makes and the next forward reads.
func TestLiveOutFromTraceGradientNotKept(t *testing.T) {
	ts := map[trace.TensorID]*trace.Tensor{
		1: {ID: 1, Bytes: 512, Kind: trace.KindActivation}, // a gradient, then the next batch's ids
		2: {ID: 2, Bytes: 512, Kind: trace.KindActivation}, // a gradient accumulated into
		3: {ID: 3, Bytes: 512, Kind: trace.KindActivation}, // a value kept for the next step
	}
	fwd, bwd := trace.PhaseForward, trace.PhaseBackward
	tr := &trace.Trace{Iterations: []*trace.Iteration{
		{Tensors: ts, Ops: []trace.Op{
			{Name: "aten::mul", Phase: fwd, Out: []trace.TensorID{3}, Mem: -1},
			{Name: "aten::sum", Phase: bwd, In: []trace.TensorID{3}, Out: []trace.TensorID{1, 2}, Mem: -1},
		}},
		{Tensors: ts, Ops: []trace.Op{
			{Name: "aten::embedding", Phase: fwd, In: []trace.TensorID{1, 3}, Mem: -1},
			{Name: "aten::add_", Phase: bwd, In: []trace.TensorID{2}, Out: []trace.TensorID{2}, Mem: -1},
		}},
	}}
	live := LiveOutFromTrace(tr, 0)
	assert.False(t, live(1), "made in the backward, first read by the next forward")
	assert.True(t, live(2), "made in the backward, first listed by the next backward")
	assert.True(t, live(3), "made in the forward, read by the next forward")
	assert.False(t, LiveOutFromTrace(tr, 1)(1), "the last iteration keeps nothing")

	// On llama16-bf16 the final norm's gradient and the next step's ids
	// share a storage id every step.
	rec, err := trace.ReadFile(testtraces.Path(t, "llama16-bf16.jsonl.gz"))
	require.NoError(t, err)
	m := Build(rec.Iterations[2], LiveOutFromTrace(rec, 2))
	lt := m.Lifetime(5160)
	require.NotNil(t, lt)
	assert.Equal(t, trace.PhaseBackward, rec.Iterations[2].Ops[lt.Alloc].Phase)
	assert.False(t, lt.LiveOut)
	next := Build(rec.Iterations[3], LiveOutFromTrace(rec, 3)).Lifetime(5160)
	require.NotNil(t, next)
	assert.True(t, next.LiveIn)
	assert.Equal(t, trace.PhaseForward, rec.Iterations[3].Ops[next.Uses[0]].Phase)
}
