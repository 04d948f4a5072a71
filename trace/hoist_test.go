package trace_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/internal/testtraces"
	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/trace"
)

// checkHoist checks h (Hoist of split) against split: the same ops, each
// once, numbered in order; the ops that are not pieces in their order; and
// for every tensor, every two ops that list it and are not pieces of one
// op in the order they had, so each op reads what it read before. It
// returns the pieces moved.
func checkHoist(t *testing.T, split *trace.Iteration, org []trace.Origin, h *trace.Iteration, horg []trace.Origin) int {
	t.Helper()
	require.Len(t, h.Ops, len(split.Ops))
	require.Len(t, horg, len(h.Ops))
	at := make(map[trace.Origin]int, len(org)) // split's index of each op
	count := map[int]int{}
	for i, o := range org {
		at[o] = i
		count[o.Op]++
	}
	kin := func(i, j int) bool { return org[i].Op == org[j].Op && count[org[i].Op] > 1 }
	where := make([]int, len(h.Ops)) // split's op -> h's
	seen := make([]bool, len(h.Ops))
	// before[i]: the ops that are not pieces ahead of split's op i.
	before := make([]int, len(split.Ops)+1)
	for i := range split.Ops {
		before[i+1] = before[i]
		if count[org[i].Op] == 1 {
			before[i+1]++
		}
	}
	moved, ahead := 0, 0
	for k, o := range horg {
		i, ok := at[o]
		require.True(t, ok, "op %d: %+v is no op of the split iteration", k, o)
		require.False(t, seen[i], "op %d: %+v twice", k, o)
		seen[i], where[i] = true, k
		require.Equal(t, k, h.Ops[k].Seq)
		want, got := split.Ops[i], h.Ops[k]
		require.Equal(t, want.Name, got.Name)
		require.Equal(t, want.In, got.In)
		require.Equal(t, want.Out, got.Out)
		require.Equal(t, want.DurUS, got.DurUS)
		if count[o.Op] == 1 {
			ahead++
			continue
		}
		if ahead < before[i] {
			moved++
			require.Positive(t, k)
			prev := h.Ops[k-1]
			require.Equal(t, prev.Phase, got.Phase, "op %d: a moved piece takes the phase of the op it follows", k)
			require.Equal(t, prev.Mem, got.Mem, "op %d: and its memory", k)
		}
	}
	var last = -1
	for i := range split.Ops {
		if count[org[i].Op] == 1 {
			require.Greater(t, where[i], last, "op %d: ops that are not pieces keep their order", i)
			last = where[i]
		}
	}
	lists := map[trace.TensorID][]int{}
	for i := range split.Ops {
		for _, id := range slices.Concat(split.Ops[i].In, split.Ops[i].Out) {
			if l := lists[id]; len(l) == 0 || l[len(l)-1] != i {
				lists[id] = append(l, i)
			}
		}
	}
	for id, l := range lists {
		for a := range l {
			for _, j := range l[a+1:] {
				if i := l[a]; !kin(i, j) {
					require.Less(t, where[i], where[j], "tensor %d: ops %d (%s) and %d (%s) swapped", id, i, split.Ops[i].Name, j, split.Ops[j].Name)
				}
			}
		}
	}
	return moved
}

// TestHoistSmall: the backward finishes the second parameter's gradient
// first; its piece of the step runs right after, the first one's after
// the first gradient, and the step counters' increment just before the
// piece that reads each.
func TestHoistSmall(t *testing.T) {
	// Parameters 1, 2; gradients 3, 4; state 5, 6, 7, 8; step counters
	// 9, 10; a loss 11.
	ts, add := twoParams(8, func(int64) int64 { return 4 }, trace.KindOptState)
	add(11, 4, trace.KindActivation)
	bwd, opt := trace.PhaseBackward, trace.PhaseOptimizer
	it := &trace.Iteration{Tensors: ts, Ops: []trace.Op{
		{Name: "aten::mm", Phase: trace.PhaseForward, In: []trace.TensorID{1, 2}, Out: []trace.TensorID{11}, Mem: 1000},
		{Name: "aten::mm_backward", Phase: bwd, Module: "b", In: []trace.TensorID{11, 2}, Out: []trace.TensorID{4}, Mem: 1300},
		{Name: "aten::mm_backward", Phase: bwd, Module: "a", In: []trace.TensorID{11, 1}, Out: []trace.TensorID{3}, Mem: 1400},
		{Name: "aten::_foreach_add_", Phase: opt, In: []trace.TensorID{9, 10}, Mem: 1400},
		{Name: "aten::_fused_adamw_", Phase: opt, In: []trace.TensorID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, Mem: 1400},
	}}
	s, org := trace.Split(it)
	require.Len(t, s.Ops, 7)
	h, horg := trace.Hoist(s, org)
	type ref struct{ op, piece int }
	order := make([]ref, len(horg))
	modules := make([]string, len(h.Ops))
	for i, o := range horg {
		order[i], modules[i] = ref{o.Op, o.Piece}, h.Ops[i].Module
	}
	require.Equal(t, []ref{
		{0, 0},
		{1, 0}, {3, 1}, {4, 1}, // the second parameter's piece after its gradient
		{2, 0}, {3, 0}, {4, 0},
	}, order)
	// The first parameter's gradient is the backward's last op: its
	// pieces stay where the step was.
	require.Equal(t, []string{"", "b", "b", "b", "a", "", ""}, modules)
	require.Equal(t, bwd, h.Ops[3].Phase)
	require.Equal(t, []trace.TensorID{2, 4, 6, 8, 10}, h.Ops[3].In)
	require.Equal(t, int64(1300), h.Ops[3].Mem)
	require.Equal(t, 2, checkHoist(t, s, org, h, horg), "the second parameter's pieces moved")
	require.Len(t, s.Ops, 7, "the split iteration is left as it was")
	require.Equal(t, "aten::_foreach_add_", s.Ops[3].Name)

	// A clip of every gradient by their norm binds every piece after it.
	clip := *it
	clip.Ops = slices.Insert(slices.Clone(it.Ops), 3, trace.Op{Name: "aten::_foreach_norm", Phase: opt, In: []trace.TensorID{3, 4}, Out: []trace.TensorID{11}, Mem: 1400},
		trace.Op{Name: "aten::_foreach_mul_", Phase: opt, In: []trace.TensorID{3, 4, 11}, Mem: 1400})
	s, org = trace.Split(&clip)
	h, horg = trace.Hoist(s, org)
	require.Zero(t, checkHoist(t, s, org, h, horg), "no piece of the step runs before the clip's last piece")
}

// TestHoistRealTraces: on the recorded traces, every op reads what it read
// before (checkHoist), the memory model takes the result, on llama16
// and llama7b-8l (AdamW, no clipping) every parameter's piece of the step
// but the last gradient's runs inside the backward, and on the
// mixed-precision trace, whose unscale reads every gradient, none moves.
func TestHoistRealTraces(t *testing.T) {
	for _, name := range []string{testtraces.Small, "llama16-bf16.jsonl.gz", "llama7b-8l-bf16.jsonl.gz",
		"mixtral8-eager-bf16.jsonl.gz", "llama16-lora.jsonl.gz", "llama16-fp16-scaler.jsonl.gz", "llama16-bf16-ckpt.jsonl.gz"} {
		t.Run(name, func(t *testing.T) {
			// Read, not from the shared cache: held for the package's
			// later tests, a trace the others do not read would grow the
			// live heap that their heap measurements pace against.
			tr, err := trace.ReadFile(testtraces.Path(t, name))
			require.NoError(t, err)
			split, origins := trace.SplitTrace(tr)
			for k := range split.Iterations {
				s, org := split.Iterations[k], origins[k]
				h, horg := trace.Hoist(s, org)
				moved := checkHoist(t, s, org, h, horg)
				m := memory.Build(h, memory.LiveOutFromTrace(split, k))
				require.Len(t, m.Curve, len(h.Ops))
				if name == "llama16-fp16-scaler.jsonl.gz" {
					// The unscale reads every gradient and the step reads
					// what it found: nothing runs before the backward ends.
					require.Zero(t, moved, "iteration %d", k)
				}
				if name != "llama16-bf16.jsonl.gz" && name != "llama7b-8l-bf16.jsonl.gz" {
					continue
				}
				inBackward, pieces := 0, 0
				for i := range h.Ops {
					if h.Ops[i].Name == "aten::_fused_adamw_" {
						pieces++
						if h.Ops[i].Phase == trace.PhaseBackward {
							inBackward++
						}
					}
				}
				require.Positive(t, moved)
				require.Greater(t, pieces, 50)
				require.GreaterOrEqual(t, inBackward, pieces-1, "iteration %d: the step's pieces run in the backward", k)
			}
		})
	}
}

// TestHoistRandom: random iterations of ops over a few tensors, with
// _foreach_ and fused steps among them, some sharing a scalar that other
// ops write: every op still reads what it read before.
func TestHoistRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	moved, shared := 0, 0
	for n := range 2000 {
		ts := map[trace.TensorID]*trace.Tensor{}
		const tensors = 24
		for id := range trace.TensorID(tensors) {
			ts[id] = &trace.Tensor{ID: id, Bytes: 64, Kind: trace.KindActivation}
		}
		// Two scalars that pieces share (a found-inf flag, a scale).
		const flag, scale = trace.TensorID(tensors), trace.TensorID(tensors + 1)
		ts[flag] = &trace.Tensor{ID: flag, Bytes: 4, Kind: trace.KindActivation}
		ts[scale] = &trace.Tensor{ID: scale, Bytes: 4, Kind: trace.KindActivation}
		pick := func(k int) []trace.TensorID {
			return slices.Collect(func(yield func(trace.TensorID) bool) {
				for _, i := range r.Perm(tensors)[:k] {
					if !yield(trace.TensorID(i)) {
						return
					}
				}
			})
		}
		it := &trace.Iteration{Tensors: ts}
		for range 5 + r.IntN(30) {
			op := trace.Op{Name: "aten::mul", In: pick(1 + r.IntN(2)), Out: pick(r.IntN(2)), Mem: -1}
			switch r.IntN(4) {
			case 0:
				op.Name, op.Out = "aten::_foreach_add_", nil
				op.In = pick(2 * (2 + r.IntN(4)))
			case 1:
				op.Name, op.Out, op.Phase = "aten::_fused_adamw_", nil, trace.PhaseOptimizer
				op.In = pick(3 * (2 + r.IntN(3)))
			}
			if op.Name != "aten::mul" && r.IntN(2) == 0 {
				op.In = append(op.In, []trace.TensorID{flag, scale}[r.IntN(2)])
			} else if r.IntN(8) == 0 {
				op.Out = []trace.TensorID{flag}
			}
			if len(op.Out) > 0 && slices.Contains(op.In, op.Out[0]) {
				op.Out = nil
			}
			op.Seq = len(it.Ops)
			it.Ops = append(it.Ops, op)
		}
		for i := range it.Ops {
			if p, ok := trace.Divide(it, &it.Ops[i]); ok && p.Shared > 0 {
				shared++
			}
		}
		s, org := trace.Split(it)
		h, horg := trace.Hoist(s, org)
		moved += checkHoist(t, s, org, h, horg)
		if t.Failed() {
			t.Fatalf("iteration %d", n)
		}
	}
	t.Logf("%d pieces moved, %d ops with shared tensors split", moved, shared)
	require.Greater(t, moved, 1000)
	require.Greater(t, shared, 100)
}
