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

// FuzzParseBoundaries: any text is a grouper or an error, and a grouper's
// groups cover the ops in order, one phase each.
func FuzzParseBoundaries(f *testing.F) {
	for _, s := range []string{"120,240,360", "model.layers.*", "0", "*.*", "1,,2", "9999999999999999999", "model.layers.*.mlp"} {
		f.Add(s)
	}
	it := testtraces.Read(f, testtraces.Small).Iterations[0]
	f.Fuzz(func(t *testing.T, s string) {
		g, err := ParseBoundaries(s)
		if err != nil {
			return
		}
		next := 0
		for _, x := range g.Group(it.Ops) {
			if x.First != next || x.Last < x.First {
				t.Fatalf("%q: group %+v after op %d", s, x, next-1)
			}
			for i := x.First; i <= x.Last; i++ {
				if it.Ops[i].Phase != x.Phase {
					t.Fatalf("%q: group %+v mixes phases", s, x)
				}
			}
			next = x.Last + 1
		}
		if next != len(it.Ops) {
			t.Fatalf("%q: groups end at %d of %d ops", s, next, len(it.Ops))
		}
	})
}
