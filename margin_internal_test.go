package chameleon

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device/host"
)

func TestDeviceDefaults(t *testing.T) {
	for name, want := range map[string]int{"npu:0": 1, "Ascend910B (npu:3)": 1, "host": 0, "NVIDIA H200 (cuda:0)": 0} {
		dev, err := host.New(1<<20, host.WithName(name))
		require.NoError(t, err)
		assert.Len(t, deviceDefaults(dev), want, name)
		require.NoError(t, dev.Close())
	}
}
