package nccl

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
)

// initAll makes n communicators on devices 0..n-1, destroyed when the test
// ends.
func initAll(t *testing.T, l *Library, n int) []*Comm {
	t.Helper()
	devs := make([]int, n)
	for i := range devs {
		devs[i] = i
	}
	comms, err := l.InitAll(devs...)
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, c := range comms {
			assert.NoError(t, c.Destroy())
		}
	})
	return comms
}

func TestInitAll(t *testing.T) {
	l, ctl := newFake(t)
	comms, err := l.InitAll(2, 0, 5)
	require.NoError(t, err)
	require.Len(t, comms, 3)
	assert.Equal(t, int32(kindAll), ctl.lastInitKind())
	for i, c := range comms {
		assert.Equal(t, i, c.Rank())
		assert.Equal(t, 3, c.Count())
		assert.Equal(t, []int{2, 0, 5}[i], c.Device())
		assert.NotZero(t, c.Handle())
		assert.Same(t, l, c.Library())
	}
	assert.Equal(t, int32(3), ctl.liveComms())
	for _, c := range comms {
		require.NoError(t, c.Destroy())
	}
	assert.Zero(t, ctl.liveComms())

	c := comms[0]
	assert.Zero(t, c.Handle())
	assert.NoError(t, c.Destroy(), "a second Destroy does nothing")
	assert.NoError(t, c.Abort())
	assert.ErrorIs(t, c.Broadcast(1, 1, 1, Uint8, 0, 0), ErrCommClosed)
	assert.ErrorIs(t, c.AllReduce(1, 1, 1, Float32, Sum, 0), ErrCommClosed)
	assert.ErrorIs(t, c.AsyncError(), ErrCommClosed)
}

func TestInitAllErrors(t *testing.T) {
	l, ctl := newFake(t)
	_, err := l.InitAll()
	assert.ErrorIs(t, err, device.ErrInvalidValue)

	_, err = l.InitAll(0, 99)
	assert.ErrorIs(t, err, ErrUnhandledCuda)
	assert.ErrorContains(t, err, "invalid device ordinal")

	_, err = l.InitAll(1, 1)
	assert.ErrorIs(t, err, ErrInvalidUsage)
	assert.ErrorContains(t, err, "duplicate GPU")

	// A failure reading a new communicator's rank destroys them all.
	ctl.failNext("ncclCommUserRank", int32(InternalError))
	_, err = l.InitAll(0, 1, 2)
	assert.ErrorIs(t, err, ErrInternal)
	assert.ErrorContains(t, err, "ncclCommUserRank")
	assert.Zero(t, ctl.liveComms())
}

// fill sets rank r's n float32s to f(r, i).
func fill(b buf, r int, f func(r, i int) float32) {
	for i := range b.float32s() {
		b.float32s()[i] = f(r, i)
	}
}

func TestAllReduce(t *testing.T) {
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) { testAllReduce(t, n) })
	}
}

func testAllReduce(t *testing.T, n int) {
	{
		l, ctl := newFake(t)
		comms := initAll(t, l, n)
		const count = 1000
		val := func(r, i int) float32 { return float32(r+1) + float32(i)*0.25 }
		send, recv, streams := make([]buf, n), make([]buf, n), make([]device.Stream, n)
		for r := range n {
			send[r], recv[r], streams[r] = ctl.alloc(t, 4*count), ctl.alloc(t, 4*count), ctl.stream(t)
			fill(send[r], r, val)
		}
		require.NoError(t, l.Group(func() error {
			for r, c := range comms {
				if err := c.AllReduce(send[r].p, recv[r].p, count, Float32, Sum, streams[r]); err != nil {
					return err
				}
			}
			return nil
		}))
		for r := range n {
			require.True(t, ctl.idle(streams[r]))
			for i, got := range recv[r].float32s() {
				var want float32
				for k := range n {
					want += val(k, i)
				}
				require.Equal(t, want, got, "%d ranks: rank %d element %d", n, r, i)
			}
		}

		// In place, averaged.
		require.NoError(t, l.Group(func() error {
			for r, c := range comms {
				if err := c.AllReduce(send[r].p, send[r].p, count, Float32, Avg, streams[r]); err != nil {
					return err
				}
			}
			return nil
		}))
		for r := range n {
			assert.Equal(t, recv[r].float32s()[7]/float32(n), send[r].float32s()[7])
		}
	}
}

func TestAllReduceHalfTypes(t *testing.T) {
	l, ctl := newFake(t)
	comms := initAll(t, l, 2)
	// 1.5 + 2.25 = 3.75 and -0.5 + 8 = 7.5, exact in both formats.
	for _, tc := range []struct {
		dt   DataType
		a, b []uint16
		want []uint16
	}{
		{Bfloat16, []uint16{0x3fc0, 0xbf00}, []uint16{0x4010, 0x4100}, []uint16{0x4070, 0x40f0}},
		{Float16, []uint16{0x3e00, 0xb800}, []uint16{0x4080, 0x4800}, []uint16{0x4380, 0x4780}},
	} {
		bufs := []buf{ctl.alloc(t, 4), ctl.alloc(t, 4)}
		copy(bufs[0].uint16s(), tc.a)
		copy(bufs[1].uint16s(), tc.b)
		require.NoError(t, l.Group(func() error {
			return errors.Join(comms[0].AllReduce(bufs[0].p, bufs[0].p, 2, tc.dt, Sum, ctl.stream(t)),
				comms[1].AllReduce(bufs[1].p, bufs[1].p, 2, tc.dt, Sum, ctl.stream(t)))
		}))
		assert.Equal(t, tc.want, bufs[0].uint16s(), "dtype %d", tc.dt)
		assert.Equal(t, tc.want, bufs[1].uint16s(), "dtype %d", tc.dt)
	}
	assert.Equal(t, []int64{2, 2, 4, 1, 0}, []int64{Float16.Size(), Bfloat16.Size(), Float32.Size(), Float8e4m3.Size(), DataType(99).Size()})
}

func TestBroadcast(t *testing.T) {
	l, ctl := newFake(t)
	comms := initAll(t, l, 3)
	const n = 4096
	bufs := make([]buf, 3)
	for r := range bufs {
		bufs[r] = ctl.alloc(t, n)
		for i := range bufs[r].bytes {
			bufs[r].bytes[i] = byte(r*7 + i)
		}
	}
	want := append([]byte(nil), bufs[1].bytes...)
	// Without a group (the fake queues and does not block): the broadcast
	// runs when the last rank has queued its part.
	before := ctl.collectives()
	streams := []device.Stream{ctl.stream(t), ctl.stream(t), ctl.stream(t)}
	for r, c := range comms {
		require.NoError(t, c.Broadcast(bufs[r].p, bufs[r].p, n, Uint8, 1, streams[r]))
		if r < 2 {
			assert.False(t, ctl.idle(streams[r]), "rank %d alone", r)
		}
	}
	for _, s := range streams {
		assert.True(t, ctl.idle(s))
	}
	s := streams[0]
	assert.Equal(t, before+1, ctl.collectives())
	for r := range bufs {
		assert.Equal(t, want, bufs[r].bytes, "rank %d", r)
	}

	assert.ErrorIs(t, comms[0].Broadcast(bufs[0].p, bufs[0].p, n, Uint8, 3, s), device.ErrInvalidValue)
	assert.ErrorIs(t, comms[0].Broadcast(bufs[0].p, bufs[0].p, -1, Uint8, 0, s), device.ErrInvalidValue)
	assert.ErrorIs(t, comms[0].AllReduce(bufs[0].p, bufs[0].p, -1, Uint8, Sum, s), device.ErrInvalidValue)
	err := comms[0].Broadcast(0, 0, n, Uint8, 0, s)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "null buffer")
}

func TestGroup(t *testing.T) {
	l, ctl := newFake(t)
	comms := initAll(t, l, 2)
	b := []buf{ctl.alloc(t, 8), ctl.alloc(t, 8)}
	before := ctl.collectives()
	require.NoError(t, l.Group(func() error {
		for r, c := range comms {
			require.NoError(t, c.AllReduce(b[r].p, b[r].p, 2, Float32, Sum, device.Stream(r)))
		}
		assert.Equal(t, before, ctl.collectives(), "deferred to GroupEnd")
		return nil
	}))
	assert.Equal(t, before+1, ctl.collectives())

	errFn := errors.New("fn failed")
	err := l.Group(func() error { return errFn })
	assert.ErrorIs(t, err, errFn)

	ctl.failNext("ncclGroupEnd", int32(InternalError))
	err = l.Group(func() error { return nil })
	assert.ErrorIs(t, err, ErrInternal)

	// A failure queued in the group surfaces at its end.
	err = l.Group(func() error {
		return errors.Join(comms[0].AllReduce(b[0].p, b[0].p, 2, DataType(42), Sum, 0))
	})
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "ncclGroupEnd")
}

// fakeDeviceContext counts Enter and Leave.
type fakeDeviceContext struct {
	enters, leaves int
	err            error
}

func (c *fakeDeviceContext) Enter() error {
	if c.err != nil {
		return c.err
	}
	c.enters++
	return nil
}

func (c *fakeDeviceContext) Leave() { c.leaves++ }

func TestInitRank(t *testing.T) {
	for _, tc := range []struct {
		variant string
		flags   []string
		byValue bool
		kind    int32
		name    string
	}{
		{"default", nil, false, kindScalable, "ncclCommInitRankScalable"},
		{"default", nil, true, kindByValue, "ncclCommInitRankScalable"},
		{"old", []string{"-DOMIT_SCALABLE", "-DFAKE_VERSION=21805"}, false, kindByValue, "ncclCommInitRank"},
	} {
		t.Run(fmt.Sprintf("%s/byValue=%v", tc.variant, tc.byValue), func(t *testing.T) {
			l, ctl := newFakeVariant(t, tc.variant, tc.flags...)
			assert.Equal(t, tc.name, l.Initialiser())
			id, err := l.UniqueID()
			require.NoError(t, err)
			assert.Equal(t, "FAKENCCL", string(id[:8]))
			for i := 8; i < len(id); i++ {
				require.NotZero(t, id[i]^id[i-1], "the id's bytes differ from their neighbours: a shifted copy shows")
			}

			dc := &fakeDeviceContext{}
			comms := make([]*Comm, 2)
			for _, r := range []int{1, 0} {
				var dev DeviceContext
				if r == 1 {
					dev = dc
				}
				comms[r], err = l.initRank(2, id, r, dev, tc.byValue)
				require.NoError(t, err)
				assert.Equal(t, tc.kind, ctl.lastInitKind())
				var got UniqueID
				ctl.lastID(&got)
				require.Equal(t, id, got, "%s: the id arrived byte for byte", tc.variant)
				assert.Equal(t, r, comms[r].Rank())
				assert.Equal(t, 2, comms[r].Count())
			}
			assert.Equal(t, 1, dc.enters)
			assert.Equal(t, 1, dc.leaves)

			// The two joined one communicator: an all-reduce between them runs.
			b := []buf{ctl.alloc(t, 4), ctl.alloc(t, 4)}
			b[0].float32s()[0], b[1].float32s()[0] = 1.5, 2
			for r, c := range comms {
				require.NoError(t, c.AllReduce(b[r].p, b[r].p, 1, Float32, Sum, ctl.stream(t)))
			}
			assert.Equal(t, float32(3.5), b[0].float32s()[0])
			assert.Equal(t, float32(3.5), b[1].float32s()[0])
			for _, c := range comms {
				require.NoError(t, c.Destroy())
			}

			// Arguments and failures.
			_, err = l.InitRank(2, id, 2, nil)
			assert.ErrorIs(t, err, device.ErrInvalidValue)
			dc.err = errors.New("no context")
			_, err = l.InitRank(2, id, 0, dc)
			assert.ErrorIs(t, err, dc.err)
			_, err = l.initRank(2, UniqueID{}, 0, nil, tc.byValue)
			assert.ErrorIs(t, err, ErrInvalidArgument, "not an id")
			assert.Zero(t, ctl.liveComms())
		})
	}
}

func TestAsyncErrorAndAbort(t *testing.T) {
	l, ctl := newFake(t)
	comms := initAll(t, l, 2)
	c := comms[0]
	assert.NoError(t, c.AsyncError())
	ctl.setAsyncError(c.Handle(), int32(InProgress))
	assert.NoError(t, c.AsyncError(), "in progress is not an error")
	ctl.setAsyncError(c.Handle(), int32(RemoteError))
	err := c.AsyncError()
	assert.ErrorIs(t, err, ErrRemote)
	assert.ErrorContains(t, err, "remote process exited")

	// Rank 0's part of a broadcast that rank 1 never joins: the abort drops it.
	b := ctl.alloc(t, 8)
	s := ctl.stream(t)
	require.NoError(t, c.Broadcast(b.p, b.p, 8, Uint8, 0, s))
	assert.False(t, ctl.idle(s))
	require.NoError(t, c.Abort())
	assert.True(t, ctl.idle(s), "the aborted part left the stream")
	assert.Zero(t, c.Handle())
	assert.NoError(t, c.Abort())
	assert.ErrorIs(t, c.Broadcast(b.p, b.p, 8, Uint8, 0, s), ErrCommClosed)
	assert.Equal(t, int32(1), ctl.liveComms())

	// An abort that fails still frees the communicator.
	ctl.failNext("ncclCommAbort", int32(InternalError))
	assert.ErrorIs(t, comms[1].Abort(), ErrInternal)
	assert.Zero(t, comms[1].Handle())
	assert.Zero(t, ctl.liveComms())
}
