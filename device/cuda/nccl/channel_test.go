package nccl

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
)

// policyChannel is the root package's PolicyChannel, which Channel
// implements (this package does not import the root one).
type policyChannel interface {
	Broadcast(ctx context.Context, payload []byte) ([]byte, error)
}

var _ policyChannel = (*Channel)(nil)

// newChannels makes the n connected ends of a Channel over the fake, each
// rank with its own Memory, as n hosts' ranks would: every rank calls
// NewChannel in its own goroutine. The ends are closed when the test ends.
func newChannels(t *testing.T, l *Library, ctl *fakeCtl, n int) ([]*Channel, []*fakeMem) {
	t.Helper()
	devs := make([]int, n)
	for i := range devs {
		devs[i] = i
	}
	comms, err := l.InitAll(devs...)
	require.NoError(t, err)
	chs, mems := make([]*Channel, n), make([]*fakeMem, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		mems[r] = newFakeMem(ctl)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			chs[r], errs[r] = NewChannel(ctx, comms[r], mems[r])
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	t.Cleanup(func() {
		for _, ch := range chs {
			assert.NoError(t, ch.Close())
		}
	})
	return chs, mems
}

// roundTrip runs one broadcast of payload from rank 0 on every rank at
// once and returns what each rank got.
func roundTrip(t *testing.T, chs []*Channel, payload []byte) [][]byte {
	t.Helper()
	got := make([][]byte, len(chs))
	errs := make([]error, len(chs))
	var wg sync.WaitGroup
	for r, ch := range chs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var in []byte
			if r == 0 {
				in = payload
			}
			got[r], errs[r] = ch.Broadcast(ctx, in)
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	return got
}

func TestChannelRoundTrip(t *testing.T) {
	l, ctl := newFake(t)
	chs, _ := newChannels(t, l, ctl, 3)
	for r, ch := range chs {
		assert.Equal(t, r, ch.Rank())
		assert.Equal(t, 3, ch.Ranks())
	}
	rng := rand.New(rand.NewPCG(1, 2))
	payload := make([]byte, 10<<10)
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	got := roundTrip(t, chs, payload)
	for r := range chs {
		require.True(t, bytes.Equal(payload, got[r]), "rank %d got rank 0's 10 KB byte for byte", r)
	}
	assert.Same(t, &payload[0], &got[0][0], "rank 0 gets its own payload back")
	got[1][0]++
	assert.NotEqual(t, got[1][0], got[2][0], "every rank has its own copy")

	// nil and empty payloads arrive as they were sent.
	for r, b := range roundTrip(t, chs, nil) {
		assert.Nil(t, b, "rank %d", r)
	}
	for r, b := range roundTrip(t, chs, []byte{}) {
		assert.NotNil(t, b, "rank %d", r)
		assert.Empty(t, b, "rank %d", r)
	}

	// Larger payloads grow the buffers; smaller ones reuse them.
	for _, n := range []int{1, 300 << 10, 7, 1 << 20} {
		p := bytes.Repeat([]byte{byte(n)}, n)
		for r, b := range roundTrip(t, chs, p) {
			require.Equal(t, p, b, "%d bytes, rank %d", n, r)
		}
	}
	for _, ch := range chs {
		assert.Equal(t, int64(1<<20), ch.dataCap)
	}
}

func TestChannelTimeoutAborts(t *testing.T) {
	l, ctl := newFake(t)
	chs, _ := newChannels(t, l, ctl, 3)
	comm := chs[0].comm

	// Rank 0 alone: its broadcast never completes.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := chs[0].Broadcast(ctx, []byte("policy"))
	assert.Less(t, time.Since(start), 5*time.Second)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, ErrDown)
	assert.ErrorContains(t, err, "rank 0 of 3")
	assert.Zero(t, comm.Handle(), "the communicator was aborted")
	assert.Equal(t, int32(2), ctl.liveComms())

	// Down for good: every later call fails at once with the same error.
	_, err2 := chs[0].Broadcast(context.Background(), []byte("again"))
	assert.Same(t, err, err2)

	// A receiver alone times out the same way.
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	_, err = chs[2].Broadcast(ctx, nil)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorContains(t, err, "rank 2 of 3")
	_, err2 = chs[2].Broadcast(context.Background(), nil)
	assert.Same(t, err, err2)

	// An already done context fails too.
	done, cancelDone := context.WithCancel(context.Background())
	cancelDone()
	_, err = chs[1].Broadcast(done, nil)
	assert.ErrorIs(t, err, context.Canceled)

	for _, ch := range chs {
		require.NoError(t, ch.Close())
	}
	assert.Zero(t, ctl.liveComms())
	assert.Zero(t, ctl.liveAllocs(), "the channels freed their buffers")
}

func TestChannelCloseInterrupts(t *testing.T) {
	l, ctl := newFake(t)
	chs, _ := newChannels(t, l, ctl, 2)
	errc := make(chan error, 1)
	go func() {
		_, err := chs[1].Broadcast(context.Background(), nil)
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, chs[1].Close())
	err := <-errc
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, err, ErrDown)
	_, err2 := chs[1].Broadcast(context.Background(), nil)
	assert.Same(t, err, err2)
	assert.NoError(t, chs[1].Close(), "idempotent")

	// Closing an idle end destroys its communicator.
	h := chs[0].comm
	require.NoError(t, chs[0].Close())
	assert.Zero(t, h.Handle())
	_, err = chs[0].Broadcast(context.Background(), []byte("x"))
	assert.ErrorIs(t, err, ErrClosed)
	assert.Zero(t, ctl.liveComms())
	assert.Zero(t, ctl.liveAllocs())
}

func TestChannelAsyncError(t *testing.T) {
	l, ctl := newFake(t)
	chs, _ := newChannels(t, l, ctl, 2)
	h := chs[1].comm.Handle()
	errc := make(chan error, 1)
	go func() {
		_, err := chs[1].Broadcast(context.Background(), nil)
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	ctl.setAsyncError(h, int32(RemoteError))
	err := <-errc
	require.ErrorIs(t, err, ErrRemote)
	require.ErrorIs(t, err, ErrDown)
	assert.Zero(t, chs[1].comm.Handle())
}

func TestChannelFailures(t *testing.T) {
	t.Run("enqueue", func(t *testing.T) {
		l, ctl := newFake(t)
		chs, _ := newChannels(t, l, ctl, 2)
		ctl.failNext("ncclBroadcast", int32(InternalError))
		_, err := chs[0].Broadcast(context.Background(), []byte("x"))
		require.ErrorIs(t, err, ErrInternal)
		require.ErrorIs(t, err, ErrDown)
		assert.ErrorContains(t, err, "fake: injected failure in ncclBroadcast")
		assert.Zero(t, chs[0].comm.Handle())
	})
	t.Run("alloc", func(t *testing.T) {
		l, ctl := newFake(t)
		chs, mems := newChannels(t, l, ctl, 2)
		mems[0].failAlloc = 1
		_, err := chs[0].Broadcast(context.Background(), []byte("needs a data buffer"))
		require.ErrorIs(t, err, device.ErrOutOfMemory)
		require.ErrorIs(t, err, ErrDown)
	})
	t.Run("query", func(t *testing.T) {
		l, ctl := newFake(t)
		chs, mems := newChannels(t, l, ctl, 2)
		mems[1].queryErr = errors.New("query failed")
		_, err := chs[1].Broadcast(context.Background(), nil)
		require.ErrorIs(t, err, mems[1].queryErr)
	})
	t.Run("new", func(t *testing.T) {
		l, ctl := newFake(t)
		comms := initAll(t, l, 2)
		mem := newFakeMem(ctl)
		mem.failAlloc = 1
		_, err := NewChannel(context.Background(), comms[0], mem)
		require.ErrorIs(t, err, device.ErrOutOfMemory)
		assert.Zero(t, comms[0].Handle(), "aborted")
		assert.Zero(t, ctl.liveAllocs(), "what was made is freed")
		_, err = NewChannel(context.Background(), nil, mem)
		assert.ErrorIs(t, err, device.ErrInvalidValue)
	})
	t.Run("new timeout", func(t *testing.T) {
		l, ctl := newFake(t)
		comms := initAll(t, l, 2)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		_, err := NewChannel(ctx, comms[1], newFakeMem(ctl))
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Zero(t, comms[1].Handle())
	})
	t.Run("out of step", func(t *testing.T) {
		l, ctl := newFake(t)
		chs, _ := newChannels(t, l, ctl, 2)
		// Rank 1 takes a plain broadcast from rank 0's communicator for a
		// channel's length: a peer that is not a Channel of the same kind.
		b := ctl.alloc(t, 8)
		copy(b.bytes, []byte{0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f})
		require.NoError(t, chs[0].comm.Broadcast(b.p, b.p, 8, Uint8, 0, ctl.stream(t)))
		_, err := chs[1].Broadcast(context.Background(), nil)
		require.ErrorIs(t, err, ErrDown)
		assert.ErrorContains(t, err, "peers out of step")
	})
}
