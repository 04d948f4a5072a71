package trace_test

import (
	"testing"

	"github.com/chameleon-go/chameleon/trace"
	"github.com/stretchr/testify/assert"
)

func TestStepParts(t *testing.T) {
	ops := func(ph ...trace.Phase) []trace.Op {
		out := make([]trace.Op, len(ph))
		for i, p := range ph {
			out[i] = trace.Op{Seq: i, Phase: p}
		}
		return out
	}
	f, b, o, u := trace.PhaseForward, trace.PhaseBackward, trace.PhaseOptimizer, trace.PhaseUnknown
	assert.Equal(t, []trace.Part{{trace.PartForward, 0, 2}, {trace.PartBackward, 3, 6}, {trace.PartAfter, 7, 8}},
		trace.StepParts(ops(u, f, f, b, o, b, b, o, o)), "an optimizer piece inside the backward is of it")
	assert.Equal(t, []trace.Part{{trace.PartBackward, 0, 1}}, trace.StepParts(ops(b, b)))
	assert.Nil(t, trace.StepParts(ops(f, f, o)), "no backward: no parts")
	assert.Nil(t, trace.StepParts(nil))
}
