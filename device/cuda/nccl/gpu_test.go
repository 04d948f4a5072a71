package nccl

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/cuda"
)

// The tests in this file need a GPU and libnccl. They run only with
// CHAMELEON_NCCL_TEST=1 (libnccl found as Open finds it; libcudart as
// device/cuda finds it), e.g.
//
//	go test -c -o nccltest ./device/cuda/nccl
//	CHAMELEON_NCCL_TEST=1 ./nccltest -test.run GPU -test.v
//
// CHAMELEON_NCCL_TEST_GPUS=n (default 1) also runs an n-rank all-reduce
// and Channel over devices 0..n-1 of this process (ncclCommInitAll).
const envTest, envTestGPUs = "CHAMELEON_NCCL_TEST", "CHAMELEON_NCCL_TEST_GPUS"

func realLibrary(t *testing.T) *Library {
	t.Helper()
	if os.Getenv(envTest) != "1" {
		t.Skipf("set %s=1 on a machine with a GPU and libnccl", envTest)
	}
	l, err := Open()
	if err != nil {
		t.Skipf("libnccl: %v", err)
	}
	v, err := l.Version()
	require.NoError(t, err)
	t.Logf("NCCL %s from %s; InitRank calls %s", v, l.Path(), l.Initialiser())
	return l
}

func realDevice(t *testing.T, ordinal int) *cuda.Device {
	t.Helper()
	d, err := cuda.New(cuda.WithDevice(ordinal), cuda.WithoutMapping())
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	return d
}

// devAlloc allocates n bytes on d, freed when the test ends.
func devAlloc(t *testing.T, d *cuda.Device, n int64) device.DevPtr {
	t.Helper()
	p, err := d.Alloc(n)
	require.NoError(t, err)
	t.Cleanup(func() { d.Free(p) })
	return p
}

func float32Bytes(f []float32) []byte {
	b := make([]byte, 4*len(f))
	for i, v := range f {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

func TestGPUOneRank(t *testing.T) {
	l := realLibrary(t)
	dev := realDevice(t, 0)
	comms, err := l.InitAll(0)
	require.NoError(t, err)
	c := comms[0]
	defer func() { assert.NoError(t, c.Destroy()) }()
	assert.Equal(t, []int{0, 1, 0}, []int{c.Rank(), c.Count(), c.Device()})
	s, err := dev.NewStream()
	require.NoError(t, err)
	defer dev.DestroyStream(s)

	// Broadcast of 1 MiB.
	const n = 1 << 20
	send, recv := devAlloc(t, dev, n), devAlloc(t, dev, n)
	pattern := make([]byte, n)
	for i := range pattern {
		pattern[i] = byte(i*131 + i>>12)
	}
	require.NoError(t, dev.WriteDevice(send, pattern))
	require.NoError(t, c.Broadcast(send, recv, n, Uint8, 0, s))
	require.NoError(t, dev.SyncStream(s))
	require.NoError(t, c.AsyncError())
	got := make([]byte, n)
	require.NoError(t, dev.ReadDevice(got, recv))
	require.Equal(t, pattern, got, "broadcast")

	// All-reduce of 1 MiB of float32: one rank's sum is its data.
	f := make([]float32, n/4)
	for i := range f {
		f[i] = float32(i%1000) * 0.5
	}
	require.NoError(t, dev.WriteDevice(send, float32Bytes(f)))
	require.NoError(t, c.AllReduce(send, recv, n/4, Float32, Sum, s))
	require.NoError(t, c.AllReduce(send, send, n/4, Float32, Avg, s))
	require.NoError(t, dev.SyncStream(s))
	require.NoError(t, dev.ReadDevice(got, recv))
	require.Equal(t, float32Bytes(f), got, "all-reduce sum")
	require.NoError(t, dev.ReadDevice(got, send))
	require.Equal(t, float32Bytes(f), got, "all-reduce avg in place")

	// InitRank with one rank, through the initialiser the library gets and,
	// when that is ncclCommInitRankScalable, through the by-value one too.
	for _, byValue := range []bool{false, true} {
		if byValue && l.commInitRankScalable == nil {
			continue
		}
		id, err := l.UniqueID()
		require.NoError(t, err)
		c2, err := l.initRank(1, id, 0, nil, byValue)
		require.NoError(t, err, "byValue=%v", byValue)
		require.NoError(t, c2.Broadcast(send, recv, n, Uint8, 0, s))
		require.NoError(t, dev.SyncStream(s))
		require.NoError(t, c2.Destroy())
	}

	// A one-rank Channel.
	comms, err = l.InitAll(0)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ch, err := NewChannel(ctx, comms[0], dev)
	require.NoError(t, err)
	payload := pattern[:10<<10]
	out, err := ch.Broadcast(ctx, payload)
	require.NoError(t, err)
	assert.Equal(t, payload, out)
	require.NoError(t, ch.Close())
}

func TestGPURanks(t *testing.T) {
	l := realLibrary(t)
	n, _ := strconv.Atoi(os.Getenv(envTestGPUs))
	if n < 2 {
		t.Skipf("set %s=n (n >= 2) to run n ranks on devices 0..n-1", envTestGPUs)
	}
	devs := make([]*cuda.Device, n)
	ordinals := make([]int, n)
	for r := range devs {
		devs[r], ordinals[r] = realDevice(t, r), r
	}

	// All-reduce of 1 MiB of float32 per rank, from one goroutine in a group.
	comms, err := l.InitAll(ordinals...)
	require.NoError(t, err)
	const count = 1 << 18
	bufs, streams := make([]device.DevPtr, n), make([]device.Stream, n)
	for r, d := range devs {
		bufs[r] = devAlloc(t, d, 4*count)
		f := make([]float32, count)
		for i := range f {
			f[i] = float32(r + 1)
		}
		require.NoError(t, d.WriteDevice(bufs[r], float32Bytes(f)))
		streams[r], err = d.NewStream()
		require.NoError(t, err)
	}
	require.NoError(t, l.Group(func() error {
		for r, c := range comms {
			if err := c.AllReduce(bufs[r], bufs[r], count, Float32, Sum, streams[r]); err != nil {
				return err
			}
		}
		return nil
	}))
	want := make([]float32, count)
	for i := range want {
		want[i] = float32(n * (n + 1) / 2)
	}
	got := make([]byte, 4*count)
	for r, d := range devs {
		require.NoError(t, d.SyncStream(streams[r]))
		require.NoError(t, d.ReadDevice(got, bufs[r]))
		require.Equal(t, float32Bytes(want), got, "rank %d", r)
		require.NoError(t, d.DestroyStream(streams[r]))
		require.NoError(t, comms[r].Destroy())
	}

	// A Channel among the ranks, one goroutine each.
	comms, err = l.InitAll(ordinals...)
	require.NoError(t, err)
	chs := make([]*Channel, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for r := range n {
		wg.Go(func() { chs[r], errs[r] = NewChannel(ctx, comms[r], devs[r]) })
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	payload := make([]byte, 10<<10)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	outs := make([][]byte, n)
	for r := range n {
		wg.Go(func() {
			var in []byte
			if r == 0 {
				in = payload
			}
			outs[r], errs[r] = chs[r].Broadcast(ctx, in)
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	for r := range n {
		require.Equal(t, payload, outs[r], "rank %d", r)
	}

	// Rank 0 alone: the broadcast times out, aborts its communicator and
	// leaves the channel down.
	tctx, tcancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer tcancel()
	_, err = chs[0].Broadcast(tctx, payload)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Zero(t, chs[0].comm.Handle())
	for _, ch := range chs {
		assert.NoError(t, ch.Close())
	}
}
