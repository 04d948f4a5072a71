package layer

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/trace"
)

// TestHalved: on a recorded step, each forward and backward group of a
// grouping becomes two halves of equal op counts (within one) covering it
// in order; other groups stay; a uniform cut halved is the uniform cut of
// twice as many groups where each phase has the ops for it.
func TestHalved(t *testing.T) {
	it := loadTrace(t, repoFile(t, "testdata/traces/llama7b-8l-bf16.jsonl.gz")).Iterations[1]
	for _, gs := range [][]Group{Uniform(it.Ops, 32), Layers(it.Ops, 16), Uniform(it.Ops, 1)} {
		h := Halved(gs)
		var k int
		for _, g := range gs {
			require.Less(t, k, len(h))
			if g.Phase != trace.PhaseForward && g.Phase != trace.PhaseBackward || g.Len() < 2 {
				assert.Equal(t, g, h[k])
				k++
				continue
			}
			a, b := h[k], h[k+1]
			k += 2
			assert.Equal(t, g.Phase, a.Phase)
			assert.Equal(t, g.Phase, b.Phase)
			assert.Equal(t, g.First, a.First)
			assert.Equal(t, a.Last+1, b.First)
			assert.Equal(t, g.Last, b.Last)
			assert.LessOrEqual(t, a.Len(), b.Len())
			assert.LessOrEqual(t, b.Len()-a.Len(), 1)
		}
		assert.Equal(t, len(h), k)
	}
	assert.Len(t, Halved(Uniform(it.Ops, 32)), len(Uniform(it.Ops, 64)))
	assert.Greater(t, len(Uniform(it.Ops, 64)), len(Uniform(it.Ops, 32)))
}
