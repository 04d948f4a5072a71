package nccl

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/cuda"
)

// Every device.Device, and so device/cuda's Device, is a Channel's Memory.
var (
	_ Memory = device.Device(nil)
	_ Memory = (*cuda.Device)(nil)
)

// TestChannelOverCudaDevice runs a one-rank Channel with a *cuda.Device as
// its Memory, over device/cuda's fake libcudart (host memory, synchronous
// copies) and the fake libnccl: the fake NCCL takes libcudart's stream
// handles as keys and its device pointers as host addresses. One rank
// only: the fake libcudart's copies do not wait for the fake NCCL's
// collectives on the stream, which a receiving rank would need.
func TestChannelOverCudaDevice(t *testing.T) {
	l, ctl := newFake(t)
	cudart := fakes.Build(t, "cudart", filepath.Join("..", "testdata", "fakecudart.c"), "libcudart.so")
	dev, err := cuda.New(cuda.WithLibrary(cudart), cuda.WithDriverLibrary(cudart), cuda.WithoutMapping())
	require.NoError(t, err)
	defer dev.Close()

	comms, err := l.InitAll(0)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch, err := NewChannel(ctx, comms[0], dev)
	require.NoError(t, err)
	payload := bytes.Repeat([]byte("chameleon"), 2000)
	got, err := ch.Broadcast(ctx, payload)
	require.NoError(t, err)
	assert.Equal(t, payload, got)
	// The bytes went through the device buffer: read it back through cudart.
	back := make([]byte, len(payload))
	require.NoError(t, dev.ReadDevice(back, ch.dataDev))
	assert.Equal(t, payload, back)

	got, err = ch.Broadcast(ctx, nil)
	require.NoError(t, err)
	assert.Nil(t, got)
	require.NoError(t, ch.Close())
	assert.Zero(t, ctl.liveComms())
}
