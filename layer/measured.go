package layer

import (
	"fmt"

	"github.com/chameleon-go/chameleon/trace"
)

// Time bases: where a plan's op times come from, as reports name them.
const (
	// BaseKernels: each op's measured GPU kernel time (an optrace-kernels
	// file, the Kineto profile of an Execution Trace), scaled to the step.
	BaseKernels = "kernels"
	// BaseRecorded: each op's recorded duration (an optrace's dur_us, with
	// its per-op sync floor) as relative weights, scaled to the step.
	BaseRecorded = "recorded"
	// BaseEstimated: an estimator's (the cost model's) times, scaled.
	BaseEstimated = "estimated"
)

// Measured spreads an iteration's time by measured per-op times: the
// kernel times of a profile of the same op sequence. An iteration that is
// not that sequence (another length, another op at some position) gets
// Fallback's estimate (Default when nil); Matches tells which.
type Measured struct {
	US       []float64 // per op, microseconds
	Names    []string  // per op, its name ("aten::mm"); nil: not checked
	Fallback Estimator
}

// FromKernels is the Measured estimator of a kernel-times file.
func FromKernels(k *trace.Kernels) *Measured {
	m := &Measured{US: make([]float64, len(k.Ops)), Names: make([]string, len(k.Ops))}
	for i, op := range k.Ops {
		m.US[i], m.Names[i] = op.KernelUS, op.Name
	}
	return m
}

// Check reports why it is not the measured op sequence, or nil.
func (m *Measured) Check(it *trace.Iteration) error {
	if len(m.US) != len(it.Ops) {
		return fmt.Errorf("%d measured ops, the iteration has %d", len(m.US), len(it.Ops))
	}
	if m.Names != nil {
		for i := range it.Ops {
			if m.Names[i] != it.Ops[i].Name {
				return fmt.Errorf("op %d is %s, the iteration's op %d (seq %d) is %s", i, m.Names[i], i, it.Ops[i].Seq, it.Ops[i].Name)
			}
		}
	}
	return nil
}

// Matches reports whether it is the measured op sequence.
func (m *Measured) Matches(it *trace.Iteration) bool { return m.Check(it) == nil }

// Estimate implements Estimator.
func (m *Measured) Estimate(it *trace.Iteration) []float64 {
	if !m.Matches(it) {
		fb := m.Fallback
		if fb == nil {
			fb = Default()
		}
		return fb.Estimate(it)
	}
	out := make([]float64, len(it.Ops))
	var sum float64
	for i, v := range m.US {
		out[i] = max(v, 0)
		sum += out[i]
	}
	fit(out, sum, it.TimeMS*1000, 0)
	return out
}

// Recorded spreads an iteration's time by its ops' recorded durations
// (DurUS) as relative weights. It reads the iteration's own per-op times,
// which the Engine's lightweight profile does not have: it is for recorded
// traces.
type Recorded struct{}

// Estimate implements Estimator.
func (Recorded) Estimate(it *trace.Iteration) []float64 {
	out := make([]float64, len(it.Ops))
	var sum float64
	for i := range it.Ops {
		out[i] = max(it.Ops[i].DurUS, 0)
		sum += out[i]
	}
	fit(out, sum, it.TimeMS*1000, 0)
	return out
}
