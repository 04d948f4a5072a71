package plan_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/internal/testtraces"
	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/plan"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// small is iteration 1 of the bundled trace with what outlives it, and its
// modelled peak.
func small(t *testing.T) (plan.Input, int64) {
	t.Helper()
	tr := testtraces.Read(t, testtraces.Small)
	in := plan.Input{Iter: tr.Iterations[1], LiveOut: memory.LiveOutFromTrace(tr, 1)}
	pre, err := plan.Prepare(in)
	require.NoError(t, err)
	return in, pre.Model.Peak
}

func TestMakeIsPure(t *testing.T) {
	in, peak := small(t)
	in.Limit = peak * 85 / 100
	a, err := plan.Make(in)
	require.NoError(t, err)
	b, err := plan.Make(in)
	require.NoError(t, err)
	require.NotEmpty(t, a.Swaps())
	assert.Equal(t, a.Swaps(), b.Swaps())
	assert.Equal(t, a.Exec.IterationUS, b.Exec.IterationUS)
	assert.Same(t, in.Iter, b.Model.Iter, "the model is of the iteration given")
}

func TestMakeTiers(t *testing.T) {
	in, peak := small(t)
	in.Limit = peak * 85 / 100
	def, err := plan.Make(in)
	require.NoError(t, err)
	// The first tier that can be met: 90% of the limit.
	assert.Equal(t, in.Limit*90/100, def.Planned)
	assert.LessOrEqual(t, def.Exec.Peak, def.Planned)
	alone, err := plan.Make(in, plan.WithTiers(100))
	require.NoError(t, err)
	assert.Equal(t, in.Limit, alone.Planned)
	assert.LessOrEqual(t, alone.Exec.Peak, in.Limit)
	var defB, aloneB int64
	for _, s := range def.Swaps() {
		defB += s.Bytes
	}
	for _, s := range alone.Swaps() {
		aloneB += s.Bytes
	}
	assert.Greater(t, defB, aloneB, "a deeper cut moves more bytes")

	// A limit only the last tier meets.
	in.Limit = peak * 75 / 100
	_, err90 := plan.Make(in, plan.WithTiers(90))
	require.ErrorIs(t, err90, mre.ErrInfeasible)
	r, err := plan.Make(in)
	if err == nil {
		assert.Greater(t, r.Planned, in.Limit*90/100)
	}
}

func TestMakeInfeasible(t *testing.T) {
	in, peak := small(t)
	in.Limit = peak / 10
	r, err := plan.Make(in)
	require.ErrorIs(t, err, mre.ErrInfeasible)
	var ie *mre.InfeasibleError
	require.True(t, errors.As(err, &ie))
	assert.Equal(t, in.Limit, ie.Limit, "the error is the one at the full limit")
	require.NotNil(t, r, "the result so far comes back")
	assert.Nil(t, r.Policy)
	assert.NotNil(t, r.Model)
	assert.Len(t, r.OpTimes, len(in.Iter.Ops))
}

func TestMakeStagesAndObserver(t *testing.T) {
	in, peak := small(t)
	in.Limit = peak * 85 / 100
	var seen []plan.Stage
	var calls struct{ group, plan, sim int }
	grouper := plan.GrouperFunc(func(ops []trace.Op) []layer.Group {
		calls.group++
		return layer.Uniform(ops, 8)
	})
	planner := plan.PlannerFunc(func(mi mre.Input, opts ...mre.Option) (*mre.Policy, error) {
		calls.plan++
		return mre.Plan(mi, opts...)
	})
	sim := plan.SimulatorFunc(func(si simulate.Input) (*simulate.Result, error) {
		calls.sim++
		return simulate.Run(si)
	})
	r, err := plan.Make(in, plan.WithGrouper(grouper), plan.WithPlanner(planner), plan.WithSimulator(sim),
		plan.WithObserver(func(s plan.Stage) func(*plan.Result, error) {
			seen = append(seen, s)
			return func(r *plan.Result, err error) { assert.NoError(t, err) }
		}))
	require.NoError(t, err)
	assert.Equal(t, []plan.Stage{plan.StageGroup, plan.StagePlan, plan.StageSimulate}, seen)
	assert.Equal(t, 1, calls.group)
	assert.Len(t, r.Groups, len(layer.Uniform(in.Iter.Ops, 8)))
	assert.Equal(t, 1, calls.plan, "the first tier is met")
	assert.Greater(t, calls.sim, 1, "the planner's rounds and the final check run on the simulator given")
}

func TestMakeRecordedCurve(t *testing.T) {
	in, peak := small(t)
	in.Limit = peak * 85 / 100
	model, err := plan.Make(in)
	require.NoError(t, err)
	rec, err := plan.Make(in, plan.WithRecordedCurve())
	require.NoError(t, err)
	assert.Equal(t, model.Model.Curve, model.Curve)
	want := make([]int64, len(in.Iter.Ops))
	for i := range in.Iter.Ops {
		want[i] = in.Iter.Ops[i].Mem
	}
	assert.Equal(t, want, rec.Curve)
}

func TestMakeRefuses(t *testing.T) {
	in, peak := small(t)
	in.Limit = peak
	tests := []struct {
		name string
		in   plan.Input
		opts []plan.Option
		want string
	}{
		{"no iteration", plan.Input{Limit: 1}, nil, "no ops"},
		{"no limit", plan.Input{Iter: in.Iter}, nil, "positive limit"},
		{"negative score weight", in, []plan.Option{plan.WithPlanOptions(mre.WithScoreWeight(-1))}, "score weight"},
		{"decreasing tiers", in, []plan.Option{plan.WithTiers(95, 90)}, "tiers"},
		{"no tiers", in, []plan.Option{plan.WithTiers()}, "tiers"},
		{"a zero link", in, []plan.Option{plan.WithLink(simulate.Link{})}, "link"},
		{"estimates for other ops", in, []plan.Option{plan.WithEstimator(estimatorFunc(func(it *trace.Iteration) []float64 { return []float64{1} }))}, "op times"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := plan.Make(tt.in, tt.opts...)
			assert.ErrorContains(t, err, tt.want)
		})
	}
	assert.NoError(t, plan.Validate())
	assert.Error(t, plan.Validate(plan.WithTiers(0)))
}

type estimatorFunc func(it *trace.Iteration) []float64

func (f estimatorFunc) Estimate(it *trace.Iteration) []float64 { return f(it) }

func TestPrepareTimesAnUntimedIteration(t *testing.T) {
	in, _ := small(t)
	c := *in.Iter
	c.TimeMS = 0
	in.Iter = &c
	r, err := plan.Prepare(in)
	require.NoError(t, err)
	var sumDur, sumEst float64
	for i := range c.Ops {
		sumDur += c.Ops[i].DurUS
		sumEst += r.OpTimes[i]
	}
	assert.InEpsilon(t, sumDur, sumEst, 1e-6, "the op durations stand in for the iteration's time")
	assert.Zero(t, c.TimeMS, "the input is not changed")
}
