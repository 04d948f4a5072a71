package plan

import (
	"fmt"
	"math"

	"github.com/chameleon-go/chameleon/layer"
)

// WithMeasured plans with measured times: us[i] is op i's time on the
// device (the Engine's timing events: µs from the end of op i-1's work to
// the end of op i's, less the time the stream waited for copies), one per
// op of the iteration. Each logical layer then takes the sum of its ops'
// measured times, and the estimator (WithEstimator) only splits that time
// among the layer's ops, in proportion to its own estimates (evenly when
// it gives the layer no time). Per-op times from events are the timeline
// of the stream, not of each kernel: a layer's total is what they measure
// well. nil turns it off; Make refuses a length other than the iteration's.
func WithMeasured(us []float64) Option {
	return optionFunc(func(c *config) { c.measured = us })
}

// splitMeasured scales est, group by group, to the measured group times.
func splitMeasured(est, measured []float64, groups []layer.Group) ([]float64, error) {
	if len(measured) != len(est) {
		return nil, fmt.Errorf("plan: %d measured op times for %d ops", len(measured), len(est))
	}
	out := make([]float64, len(est))
	for i, m := range measured {
		out[i] = max(m, 0) // an op no group holds keeps its own
	}
	for _, g := range groups {
		var want, have float64
		for i := g.First; i <= g.Last; i++ {
			m := measured[i]
			if math.IsNaN(m) || math.IsInf(m, 0) {
				return nil, fmt.Errorf("plan: measured time of op %d is %v", i, m)
			}
			want += max(m, 0)
			have += max(est[i], 0)
		}
		for i := g.First; i <= g.Last; i++ {
			switch {
			case have > 0:
				out[i] = max(est[i], 0) * want / have
			default:
				out[i] = want / float64(g.Len())
			}
		}
	}
	return out, nil
}
