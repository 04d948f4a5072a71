package layer

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/trace"
)

func TestCut(t *testing.T) {
	ops := make([]trace.Op, 10)
	for i := range ops {
		ops[i].Phase = trace.PhaseForward
		if i >= 6 {
			ops[i].Phase = trace.PhaseBackward
		}
	}
	got := Cut(ops, []int{3, 3, 0, 8, 99, -1})
	assert.Equal(t, []Group{
		{Phase: trace.PhaseForward, First: 0, Last: 2}, {Phase: trace.PhaseForward, First: 3, Last: 5},
		{Phase: trace.PhaseBackward, First: 6, Last: 7}, {Phase: trace.PhaseBackward, First: 8, Last: 9},
	}, got)
	assert.Len(t, Cut(ops, nil), 2, "phase changes alone")
}

func TestByModuleOnRealTrace(t *testing.T) {
	it := loadTrace(t, repoFile(t, "testdata/llama4-small.jsonl.gz")).Iterations[0]
	p, err := ParseModulePattern("model.layers.*")
	require.NoError(t, err)
	gs := ByModule(it.Ops, p)
	// 4 layers forward and backward, with the embedding before and the
	// norm, head and loss after them in each phase, and the optimizer.
	perPhase := map[trace.Phase]int{}
	next := 0
	for _, g := range gs {
		perPhase[g.Phase]++
		assert.Equal(t, next, g.First, "groups are consecutive")
		next = g.Last + 1
		for i := g.First; i <= g.Last; i++ {
			assert.Equal(t, g.Phase, it.Ops[i].Phase)
		}
	}
	assert.Equal(t, len(it.Ops), next)
	assert.Equal(t, 6, perPhase[trace.PhaseForward], "embedding, 4 layers, norm+head+loss")
	assert.GreaterOrEqual(t, perPhase[trace.PhaseBackward], 5)
	// Every layer group holds one layer's ops.
	for _, g := range gs {
		seen := map[string]bool{}
		for i := g.First; i <= g.Last; i++ {
			if k := p.key(it.Ops[i].Module); k != "" {
				seen[k] = true
			}
		}
		assert.LessOrEqual(t, len(seen), 1, "group %d-%d spans %v", g.First, g.Last, seen)
	}
	for _, bad := range []string{"", "model..layers", " "} {
		_, err := ParseModulePattern(bad)
		assert.Error(t, err, "%q", bad)
	}
}
