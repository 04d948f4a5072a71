package layer

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/trace"
)

// TestUniformCutsAStepInPieces: on llama7b-8l, the fused AdamW step whole
// is a short optimizer run and stays one group; split into its pieces
// (trace.Split) it is longer than a forward group and is cut into n groups
// like the forward and the backward. Either way the groups cover every op
// once, in order, each within one phase.
func TestUniformCutsAStepInPieces(t *testing.T) {
	tr := loadTrace(t, repoFile(t, "testdata/traces/llama7b-8l-bf16.jsonl.gz"))
	whole := tr.Iterations[1]
	split, _ := trace.Split(whole)
	for _, c := range []struct {
		name string
		it   *trace.Iteration
		want int
	}{{"whole", whole, 1}, {"in pieces", split, 32}} {
		t.Run(c.name, func(t *testing.T) {
			ops := c.it.Ops
			gs := Uniform(ops, 32)
			opt, next := 0, 0
			for _, g := range gs {
				require.Equal(t, next, g.First, "groups are consecutive")
				require.LessOrEqual(t, g.First, g.Last)
				for i := g.First; i <= g.Last; i++ {
					require.Equal(t, g.Phase, ops[i].Phase, "op %d in a group of another phase", i)
				}
				if g.Phase == trace.PhaseOptimizer {
					opt++
				}
				next = g.Last + 1
			}
			assert.Equal(t, len(ops), next, "every op in a group")
			assert.Equal(t, c.want, opt, "optimizer groups")
		})
	}
}
