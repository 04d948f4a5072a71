package chameleon_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device/host"
)

// TestOpenNamesEveryPlaceTried: with no accelerator runtime to load, Open
// fails with ErrNoDevice and names the places it tried for each.
func TestOpenNamesEveryPlaceTried(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("CHAMELEON_CUDART", filepath.Join(dir, "libcudart.so"))
	t.Setenv("ASCEND_HOME_PATH", filepath.Join(dir, "ascend"))
	e, err := chameleon.Open(chameleon.WithMemoryLimit(1 << 20))
	if err == nil {
		e.Close()
		t.Skip("an accelerator runtime loads from the loader's path here")
	}
	assert.ErrorIs(t, err, chameleon.ErrNoDevice)
	assert.ErrorContains(t, err, filepath.Join(dir, "libcudart.so"))
	assert.ErrorContains(t, err, filepath.Join(dir, "ascend", "lib64", "libascendcl.so"))
}

// TestOpenWithDevice: Open over WithDevice's device is New over it, and
// leaves the device to its caller.
func TestOpenWithDevice(t *testing.T) {
	dev, err := host.New(1 << 20)
	require.NoError(t, err)
	defer dev.Close()
	e, err := chameleon.Open(chameleon.WithDevice(dev), chameleon.WithMemoryLimit(256<<10))
	require.NoError(t, err)
	assert.Same(t, dev, e.Device())
	require.NoError(t, e.Close())
	s, err := dev.NewStream()
	require.NoError(t, err, "the device is still open")
	require.NoError(t, dev.DestroyStream(s))
}
