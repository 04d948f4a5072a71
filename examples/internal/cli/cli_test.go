package cli_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/examples/internal/cli"
)

func TestParseLimit(t *testing.T) {
	for s, want := range map[string]int64{"none": 0, "50%": 500, " 100% ": 1000, "2KiB": 2048, "512B": 512} {
		got, err := cli.ParseLimit(s, 1000)
		require.NoError(t, err, s)
		assert.Equal(t, want, got, s)
	}
	for s, msg := range map[string]string{
		"abc": `--limit "abc"`, "40": "did you mean 40%", "0%": "above 0%", "150%": "above 100%",
		"-1GiB": "negative", "0": "holds nothing", "5000": "no unit", "x%": "not a percentage", "0B": "holds nothing",
	} {
		_, err := cli.ParseLimit(s, 1000)
		assert.ErrorIs(t, err, cli.ErrUsage, s)
		assert.ErrorContains(t, err, msg, s)
	}
}

func TestMedian(t *testing.T) {
	assert.True(t, math.IsNaN(cli.Median(nil)))
	assert.Equal(t, 2.0, cli.Median([]float64{3, 1, 2}))
	assert.Equal(t, 2.5, cli.Median([]float64{4, 1, 3, 2}))
}
