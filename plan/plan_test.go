package plan_test

import (
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
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

// TestMakeLayout: by default Make plans for the limit alone and lays the
// plan's blocks out in pages of the CUDA size for the limit; the layout
// fits the limit, the plan's curve stays under it, and a tighter plan was
// made only where the first one's blocks did not fit. Lower tiers remain
// as an escape hatch.
func TestMakeLayout(t *testing.T) {
	in, peak := small(t)
	in.Limit = peak * 85 / 100
	def, err := plan.Make(in)
	require.NoError(t, err)
	require.NotNil(t, def.Layout)
	assert.True(t, def.Layout.Fits(), "need %d of %d", def.Layout.Need(), in.Limit)
	assert.LessOrEqual(t, def.Planned, in.Limit)
	assert.LessOrEqual(t, def.Exec.Peak, def.Planned)
	assert.Equal(t, device.PageFor(in.Limit, 2<<20, 16<<20), def.Layout.Page)
	assert.GreaterOrEqual(t, def.Layout.Live, def.Exec.Peak, "the blocks hold what the simulated curve holds")
	assert.LessOrEqual(t, def.Layout.Live, def.Exec.Peak+4*max(def.Layout.Page, in.Limit>>10), "and a few small values kept into the next step")

	bytes, err := plan.Make(in, plan.WithoutLayout())
	require.NoError(t, err)
	assert.Nil(t, bytes.Layout)
	assert.Equal(t, in.Limit, bytes.Planned, "without a layout, the limit alone")
	if def.Tries == 0 {
		assert.Equal(t, bytes.Swaps(), def.Swaps(), "a plan whose blocks fit is the plan")
	} else {
		// Planned again for less: everywhere, or where the blocks did not
		// fit (Held), the policy meeting the limit less what is held.
		if def.Held != nil {
			assert.Equal(t, in.Limit, def.Planned)
			assert.Positive(t, slices.Max(def.Held))
			assert.Len(t, def.Held, len(def.Curve))
			assert.LessOrEqual(t, def.Policy.Sim.Peak, def.Planned, "the planner's curve, raised by what is held, under the limit")
		} else {
			assert.Less(t, def.Planned, in.Limit)
		}
		lay := plan.LayOut(bytes, def.Layout.Page, in.Limit)
		assert.False(t, lay.Fits(), "planned again though the first plan's blocks fit")
	}

	tiers, err := plan.Make(in, plan.WithTiers(90, 95, 100))
	require.NoError(t, err)
	assert.LessOrEqual(t, tiers.Planned, in.Limit*90/100, "the first tier that can be met, or lower for its layout")

	// A limit only the last tier meets.
	in.Limit = peak * 75 / 100
	_, err90 := plan.Make(in, plan.WithTiers(90))
	require.ErrorIs(t, err90, mre.ErrInfeasible)
	r, err := plan.Make(in, plan.WithTiers(90, 95, 100))
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
	assert.Equal(t, []plan.Stage{plan.StageGroup, plan.StagePlan, plan.StageSimulate, plan.StageLayout}, seen)
	assert.Equal(t, 1, calls.group)
	assert.Len(t, r.Groups, len(layer.Uniform(in.Iter.Ops, 8)))
	assert.Equal(t, 1+r.Tries, calls.plan, "the limit, then once per layout that did not fit")
	assert.Greater(t, calls.sim, 1, "the planner's rounds and the final check run on the simulator given")
}

// TestObserverSeesBothPlans: where Make plans twice, the Observer is told
// of the stages of each plan, each with its own result, and then of
// StageChoose with the plan kept, the faster of the two.
func TestObserverSeesBothPlans(t *testing.T) {
	in, peak := small(t)
	in.Limit = peak * 85 / 100
	var mu sync.Mutex
	var order []plan.Stage
	ended := map[int]*plan.Result{} // plan_groups -> the result its layout stage ended with
	var chosen *plan.Result
	r, err := plan.Make(in, plan.WithObserver(func(s plan.Stage) func(*plan.Result, error) {
		return func(r *plan.Result, err error) {
			mu.Lock()
			defer mu.Unlock()
			require.NoError(t, err)
			order = append(order, s)
			switch s {
			case plan.StageLayout:
				ended[len(r.PlanGroups)] = r
			case plan.StageChoose:
				chosen = r
			}
		}
	}))
	require.NoError(t, err)
	count := map[plan.Stage]int{}
	for _, s := range order {
		count[s]++
	}
	assert.Equal(t, map[plan.Stage]int{plan.StageGroup: 1, plan.StagePlan: 2, plan.StageSimulate: 2, plan.StageLayout: 2, plan.StageChoose: 1}, count)
	assert.Equal(t, plan.StageGroup, order[0])
	assert.Equal(t, plan.StageChoose, order[len(order)-1], "the choice follows both plans")
	require.Len(t, ended, 2, "the two plans count their prefetches over different layers")
	require.Same(t, r, chosen, "choose is told with the result Make returns")
	var other *plan.Result // the plan not kept
	for n, e := range ended {
		if n != len(r.PlanGroups) {
			other = e
		}
	}
	require.NotNil(t, other)
	assert.LessOrEqual(t, r.Exec.IterationUS, other.Exec.IterationUS, "the plan kept is not the slower")

	// Planned once, no choice is made.
	order = nil
	_, err = plan.Make(in, plan.WithOneGrouping(), plan.WithObserver(func(s plan.Stage) func(*plan.Result, error) {
		order = append(order, s)
		return func(*plan.Result, error) {}
	}))
	require.NoError(t, err)
	assert.Equal(t, []plan.Stage{plan.StageGroup, plan.StagePlan, plan.StageSimulate, plan.StageLayout}, order)
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
