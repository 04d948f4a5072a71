package plan

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/plan/place"
)

// TestFitOpsHoldsBackThePartialPage: a block that reaches into the
// budget's last partial page is over the limit (the device maps whole
// pages), so fitOps holds its bytes above the whole pages back over its
// life, not nothing as for a block with no place.
func TestFitOpsHoldsBackThePartialPage(t *testing.T) {
	const page = 1 << 20
	budget := int64(3*page + page/2) // three whole pages and half of a fourth
	r := Result{Curve: make([]int64, 10), Planned: budget, Layout: &Layout{
		Page: page, Budget: budget, Touched: 4, Most: 4,
		Blocks: []Block{
			{Size: 3 * page, Life: place.Once(0, 10), Off: 0},
			{Size: page / 4, Life: place.Once(2, 5), Off: 3 * page}, // in the partial page
		},
	}}
	require.False(t, r.Layout.Fits())
	assert.Equal(t, int64(3*page), r.Layout.Top())
	assert.Equal(t, int64(page), r.Layout.Over())

	var asked []int64
	planAt := func(_ int64, held []int64) (*mre.Policy, error) {
		asked = held
		return nil, mre.ErrInfeasible
	}
	_, err := r.fitOps(config{}, page, budget, planAt, nil)
	require.NoError(t, err)
	require.NotNil(t, asked, "a plan holding back the block's bytes was asked for")
	for op, h := range asked {
		if op >= 2 && op < 5 {
			assert.Equal(t, int64(page/4), h, "op %d: the block's bytes above the whole pages", op)
		} else {
			assert.Zero(t, h, "op %d", op)
		}
	}
}
