package plan

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/internal/testtraces"
)

func TestParseBoundaries(t *testing.T) {
	it := testtraces.Read(t, testtraces.Small).Iterations[0]
	g, err := ParseBoundaries("120, 240,360")
	require.NoError(t, err)
	gs := g.Group(it.Ops)
	var firsts []int
	for _, x := range gs {
		firsts = append(firsts, it.Ops[x.First].Seq)
	}
	assert.Subset(t, firsts, []int{0, 120, 240, 360}, "each boundary starts a group")
	for i := 1; i < len(gs); i++ {
		assert.Equal(t, gs[i-1].Last+1, gs[i].First)
	}
	g, err = ParseBoundaries("model.layers.*")
	require.NoError(t, err)
	assert.Greater(t, len(g.Group(it.Ops)), 8)
	for _, bad := range []string{"", "12,x", "1,-3", "model..x"} {
		_, err := ParseBoundaries(bad)
		assert.ErrorContains(t, err, "boundaries", "%q", bad)
	}
}
