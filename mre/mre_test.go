package mre

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

const mib = 1 << 20

// synthetic builds a small iteration: a parameter used by every op, and
// activations made in the first half and used again in the second.
func synthetic(rng *rand.Rand, nops, ntensors int) *trace.Iteration {
	it := &trace.Iteration{Tensors: map[trace.TensorID]*trace.Tensor{}}
	param := &trace.Tensor{ID: 1, Bytes: int64(rng.IntN(8)+1) * mib, Kind: trace.KindParam}
	it.Tensors[param.ID] = param
	it.Ops = make([]trace.Op, nops)
	for t := range it.Ops {
		ph := trace.PhaseForward
		if t >= nops/2 {
			ph = trace.PhaseBackward
		}
		it.Ops[t] = trace.Op{Seq: t, Name: fmt.Sprintf("op%d", t), Phase: ph, In: []trace.TensorID{param.ID}, Mem: -1}
	}
	for x := range ntensors {
		id := trace.TensorID(10 + x)
		it.Tensors[id] = &trace.Tensor{ID: id, Bytes: int64(rng.IntN(16)+1) * mib / 2, Kind: trace.KindActivation}
		a := rng.IntN(max(nops/2, 1))
		it.Ops[a].Out = append(it.Ops[a].Out, id)
		uses := rng.IntN(3) + 1
		for range uses {
			u := a + 1 + rng.IntN(nops-a-1)
			it.Ops[u].In = append(it.Ops[u].In, id)
		}
	}
	it.TimeMS = float64(nops) * 0.05
	return it
}

func opTimes(rng *rand.Rand, n int) []float64 {
	d := make([]float64, n)
	for t := range d {
		d[t] = 10 + 90*rng.Float64()
	}
	return d
}

// checkValid checks a plan against the curve independently of the planner:
// every op stays under the limit with each swap's bytes removed over
// [Free, In), the ordering rules hold, and no op strictly between Out and
// Use touches the tensor while Out and Use do.
func checkValid(t testing.TB, it *trace.Iteration, curve []int64, swaps []simulate.Swap, limit int64) {
	t.Helper()
	mem := append([]int64(nil), curve...)
	uses := func(op trace.Op, id trace.TensorID) bool {
		for _, x := range op.In {
			if x == id {
				return true
			}
		}
		for _, x := range op.Out {
			if x == id {
				return true
			}
		}
		return false
	}
	for _, s := range swaps {
		require.True(t, s.Out < s.Free && s.Free < s.In && s.In <= s.Use, "order %+v", s)
		require.Equal(t, it.Tensors[s.Tensor].Kind, trace.KindActivation, "kind %+v", s)
		require.True(t, uses(it.Ops[s.Out], s.Tensor) && uses(it.Ops[s.Use], s.Tensor), "ends must use the tensor %+v", s)
		for o := s.Out + 1; o < s.Use; o++ {
			require.False(t, uses(it.Ops[o], s.Tensor), "op %d uses swapped tensor %+v", o, s)
		}
		for o := s.Free; o < s.In; o++ {
			mem[o] -= s.Bytes
		}
	}
	for o, v := range mem {
		require.LessOrEqual(t, v, limit, "op %d over the limit", o)
	}
}

// bruteFeasible enumerates every subset of candidate gaps, each swapped
// over its whole gap, and reports whether one meets the limit.
func bruteFeasible(curve []int64, cs []Candidate, limit int64) bool {
	for mask := 0; mask < 1<<len(cs); mask++ {
		ok := true
		for t, v := range curve {
			for x, c := range cs {
				if mask&(1<<x) != 0 && c.Out < t && t < c.Use {
					v -= c.Bytes
				}
			}
			if v > limit {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

func TestPlanMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	feasibleCount := 0
	for trial := range 400 {
		it := synthetic(rng, 6+rng.IntN(14), 2+rng.IntN(6))
		m := memory.Build(it, nil)
		curve := m.Curve
		peak := m.Peak
		limit := int64(float64(peak) * (0.4 + 0.6*rng.Float64()))
		cs := Candidates(m, curve, limit, 0)
		if len(cs) > 14 {
			continue
		}
		want := bruteFeasible(curve, cs, limit)
		d := opTimes(rng, len(it.Ops))
		p, err := Plan(Input{Model: m, OpTimes: d, Groups: layer.Uniform(it.Ops, 3), Limit: limit}, WithMinBytes(0))
		if !want {
			require.ErrorIs(t, err, ErrInfeasible, "trial %d", trial)
			continue
		}
		feasibleCount++
		require.NoError(t, err, "trial %d: brute force found a plan", trial)
		checkValid(t, it, curve, p.Swaps, limit)
		assert.LessOrEqual(t, p.Sim.Peak, limit)
		b := LowerBound(curve, limit, d, 55e9, 55e9)
		assert.GreaterOrEqual(t, p.Sim.IterationUS-p.Sim.BaseUS, b.OverheadUS-1e-6, "trial %d: beat the lower bound", trial)
	}
	t.Logf("%d feasible trials", feasibleCount)
	assert.Greater(t, feasibleCount, 50)
}

func TestInfeasibleError(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	it := synthetic(rng, 10, 4)
	m := memory.Build(it, nil)
	_, err := Plan(Input{Model: m, OpTimes: opTimes(rng, 10), Limit: 1})
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrInfeasible))
	var ie *InfeasibleError
	require.ErrorAs(t, err, &ie)
	assert.Positive(t, ie.Shortfall)
	assert.Contains(t, err.Error(), fmt.Sprintf("at op %d", ie.Op))
}

func TestNoSwapNeeded(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	it := synthetic(rng, 10, 4)
	m := memory.Build(it, nil)
	p, err := Plan(Input{Model: m, OpTimes: opTimes(rng, 10), Limit: m.Peak})
	require.NoError(t, err)
	assert.Empty(t, p.Swaps)
	assert.Empty(t, p.MRL)
	assert.InDelta(t, 0, p.Sim.OverheadPct(), 1e-9)
}

func TestLowerBound(t *testing.T) {
	// 4 ops of 100 us; 11 MB over the limit after op 2 at 55 GB/s (200 us
	// each way): op 2 starts at 200 us, so the copy out costs nothing; the
	// copy back starts when op 2 ends and must finish before op 3 starts,
	// which it would at once: 200 us.
	curve := []int64{0, 0, 11e6, 0}
	b := LowerBound(curve, 0, []float64{100, 100, 100, 100}, 55e9, 55e9)
	assert.InDelta(t, 200, b.OverheadUS, 1e-6)
	assert.Equal(t, 2, b.InOp)
	// After op 1 (starts at 100 us): 100 us late out; back from 200 us,
	// with op 2 (100 us) to hide behind: 100 us more.
	b = LowerBound([]int64{0, 11e6, 0, 0}, 0, []float64{100, 100, 100, 100}, 55e9, 55e9)
	assert.InDelta(t, 100+100, b.OverheadUS, 1e-6)
}

func TestSwapAllBaseline(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	it := synthetic(rng, 20, 6)
	m := memory.Build(it, nil)
	for _, s := range SwapAll(m) {
		assert.Equal(t, trace.PhaseForward, it.Ops[s.Out].Phase)
		assert.Equal(t, trace.PhaseBackward, it.Ops[s.Use].Phase)
		assert.Equal(t, s.Use, s.In)
		assert.Negative(t, s.Free)
	}
}

func FuzzPlan(f *testing.F) {
	f.Add(uint64(1), uint8(10), uint8(4), uint8(50))
	f.Add(uint64(42), uint8(30), uint8(9), uint8(20))
	f.Fuzz(func(t *testing.T, seed uint64, nops, nt, pct uint8) {
		rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		n := int(nops%40) + 2
		it := synthetic(rng, n, int(nt%12)+1)
		m := memory.Build(it, nil)
		limit := m.Peak * int64(pct%101) / 100
		d := opTimes(rng, n)
		p, err := Plan(Input{Model: m, OpTimes: d, Groups: layer.Uniform(it.Ops, 4), Limit: limit}, WithMinBytes(0))
		if err != nil {
			require.ErrorIs(t, err, ErrInfeasible)
			require.False(t, bruteFeasibleAll(m, limit), "planner gave up on a feasible limit")
			return
		}
		checkValid(t, it, m.Curve, p.Swaps, limit)
		require.LessOrEqual(t, p.Sim.Peak, limit)
		require.GreaterOrEqual(t, p.Sim.IterationUS, p.Sim.BaseUS-1e-6)
	})
}

// bruteFeasibleAll: swapping every gap is the most any subset can do.
func bruteFeasibleAll(m *memory.Model, limit int64) bool {
	cs := Candidates(m, m.Curve, limit, 0)
	for t, v := range m.Curve {
		for _, c := range cs {
			if c.Out < t && t < c.Use {
				v -= c.Bytes
			}
		}
		if v > limit {
			return false
		}
	}
	return true
}

// TestWrappingOptimizerState: optimizer state used only by the last op
// (a per-parameter optimizer) is idle from one step's optimizer to the
// next. When the gaps inside the iteration cannot meet the limit, the plan
// moves it over the iteration boundary: out after its use, back before
// its use in the next step.
func TestWrappingOptimizerState(t *testing.T) {
	it := &trace.Iteration{Tensors: map[trace.TensorID]*trace.Tensor{
		1: {ID: 1, Bytes: 40 * mib, Kind: trace.KindOptState},
		2: {ID: 2, Bytes: 20 * mib, Kind: trace.KindActivation},
	}}
	for t := range 10 {
		op := trace.Op{Seq: t, Name: "op", Phase: trace.PhaseForward, Mem: -1}
		switch t {
		case 0:
			op.Out = []trace.TensorID{2}
		case 1:
			op.In = []trace.TensorID{2}
		case 9:
			op.Phase, op.In, op.Out = trace.PhaseOptimizer, []trace.TensorID{1}, []trace.TensorID{1}
		}
		it.Ops = append(it.Ops, op)
	}
	m := memory.Build(it, nil)
	times := make([]float64, 10)
	for x := range times {
		times[x] = 1000 // µs; 40 MiB crosses the link in ~760 µs
	}
	const limit = 45 * mib
	// The activation has no gap: nothing inside the iteration helps.
	require.Empty(t, Candidates(m, m.Curve, limit, 0))
	pol, err := Plan(Input{Model: m, OpTimes: times, Limit: limit})
	require.NoError(t, err)
	require.Len(t, pol.Swaps, 1)
	w := pol.Swaps[0]
	assert.True(t, w.Wraps(), "%+v", w)
	assert.Equal(t, trace.TensorID(1), w.Tensor)
	assert.Equal(t, 9, w.Out)
	assert.Equal(t, 9, w.Use)
	assert.LessOrEqual(t, pol.Sim.Peak, int64(limit))
	assert.Zero(t, pol.Sim.StallUS)
	for x, op := range pol.Sim.Ops {
		if x >= w.In && x < w.Free {
			assert.Equal(t, m.Curve[x], op.Mem, "op %d: back on the device", x)
		} else {
			assert.Equal(t, m.Curve[x]-40*mib, op.Mem, "op %d: on the host", x)
		}
	}
	// Without the gap across the boundary there is no plan.
	it.Tensors[1].Kind = trace.KindActivation
	_, err = Plan(Input{Model: memory.Build(it, nil), OpTimes: times, Limit: limit})
	assert.ErrorIs(t, err, ErrInfeasible)
}
