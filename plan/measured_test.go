package plan_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/plan"
	"github.com/chameleon-go/chameleon/trace"
)

// TestMeasuredGroupTimes: with measured op times, each group's time is the
// measured one and the estimator's shares inside the group are kept; the
// plan is made on them.
func TestMeasuredGroupTimes(t *testing.T) {
	in, peak := small(t)
	n := len(in.Iter.Ops)
	meas := make([]float64, n)
	for i := range meas {
		meas[i] = float64(10 + 37*(i%11)) // µs, unrelated to the estimate
	}
	est, err := plan.Prepare(in)
	require.NoError(t, err)
	assert.False(t, est.Measured)
	got, err := plan.Prepare(in, plan.WithMeasured(meas))
	require.NoError(t, err)
	require.True(t, got.Measured)
	require.Equal(t, est.Groups, got.Groups)
	for _, g := range got.Groups {
		var want, sum, base float64
		for i := g.First; i <= g.Last; i++ {
			want += meas[i]
			sum += got.OpTimes[i]
			base += est.OpTimes[i]
		}
		assert.InEpsilon(t, want, sum, 1e-9, "group %+v takes its measured time", g)
		for i := g.First; i <= g.Last; i++ {
			assert.InDelta(t, est.OpTimes[i]/base, got.OpTimes[i]/sum, 1e-12, "op %d keeps its share of the group", i)
		}
	}

	r, err := plan.Make(plan.Input{Iter: in.Iter, LiveOut: in.LiveOut, Limit: peak * 8 / 10}, plan.WithMeasured(meas))
	require.NoError(t, err)
	require.NotNil(t, r.Exec)
	var total float64
	for _, m := range meas {
		total += m
	}
	assert.InEpsilon(t, total, r.Exec.BaseUS, 1e-9, "the simulator runs the measured step")
}

func TestMeasuredEdges(t *testing.T) {
	in, _ := small(t)
	_, err := plan.Prepare(in, plan.WithMeasured(make([]float64, 3)))
	assert.ErrorContains(t, err, "3 measured op times for")
	bad := make([]float64, len(in.Iter.Ops))
	bad[5] = math.NaN()
	_, err = plan.Prepare(in, plan.WithMeasured(bad))
	assert.ErrorContains(t, err, "measured time of op 5 is NaN")

	// An estimator that gives a group no time: the group's measured time
	// is spread evenly over its ops.
	meas := make([]float64, len(in.Iter.Ops))
	for i := range meas {
		meas[i] = float64(i % 5)
	}
	r, err := plan.Prepare(in, plan.WithEstimator(zeroEstimator{}), plan.WithMeasured(meas))
	require.NoError(t, err)
	g := r.Groups[1]
	var want float64
	for i := g.First; i <= g.Last; i++ {
		want += meas[i]
	}
	for i := g.First; i <= g.Last; i++ {
		assert.InDelta(t, want/float64(g.Len()), r.OpTimes[i], 1e-9)
	}
}

// zeroEstimator gives every op no time.
type zeroEstimator struct{}

func (zeroEstimator) Estimate(it *trace.Iteration) []float64 { return make([]float64, len(it.Ops)) }
