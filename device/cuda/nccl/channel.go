package nccl

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"time"

	"github.com/chameleon-go/chameleon/device"
)

// Memory is what a Channel needs of the device its communicator runs on:
// device and pinned host buffers, a stream of its own, copies on it and an
// event to poll. Every device.Device has these methods, so a
// *cuda.Device (device/cuda) is a Memory as it is.
type Memory interface {
	Alloc(size int64) (device.DevPtr, error)
	Free(p device.DevPtr) error
	AllocHost(size int64) (device.HostBuf, error)
	FreeHost(b device.HostBuf) error
	NewStream() (device.Stream, error)
	DestroyStream(s device.Stream) error
	CopyH2D(dst device.DevPtr, src device.HostBuf, s device.Stream) error
	CopyD2H(dst device.HostBuf, src device.DevPtr, s device.Stream) error
	NewEvent() (device.Event, error)
	Record(ev device.Event, s device.Stream) error
	Query(ev device.Event) (done bool, err error)
	DestroyEvent(ev device.Event) error
}

// MaxPayload is the largest payload a Channel carries (1 GiB); a larger
// length from rank 0 is taken for a peer out of step.
const MaxPayload = 1 << 30

// Errors of a Channel.
var (
	// ErrDown wraps the error of the Broadcast that took the channel down;
	// every later Broadcast returns that same error.
	ErrDown = errors.New("nccl: channel down")
	// ErrClosed is the cause once Close was called.
	ErrClosed = errors.New("nccl: channel closed")
)

// Polling of the stream: the first wait, doubled up to the last.
const (
	pollFirst = 20 * time.Microsecond
	pollLast  = 2 * time.Millisecond
)

// headerMagic is what NewChannel's first broadcast carries: a rank that
// gets anything else is not talking to a Channel of the same kind.
const headerMagic = 0x63686d6c6e63636c // "chmlnccl"

// minData is the smallest data buffer a Channel allocates.
const minData = 64 << 10

// Channel is one rank's end of a policy channel over NCCL: it implements
// the root package's PolicyChannel (Broadcast from rank 0) and Close, with
// the contract of chameleon.LocalChannel. Rank 0's Broadcast sends its
// payload; every other rank's passes nil and returns rank 0's bytes. A
// broadcast is two collectives on the channel's own stream: the length
// (an int64; -1 for a nil payload), then the bytes, through device
// buffers the channel keeps and grows.
//
// Broadcast blocks the calling goroutine until the exchange is done on
// this rank, polling the stream rather than blocking in the driver, so
// that it returns when ctx is done; the Engine calls it from its planning
// worker, never from End. A Broadcast that fails (ctx done, Close, an
// error of the device or of NCCL, an asynchronous NCCL error) aborts the
// communicator (ncclCommAbort), since the ranks are out of step, and the
// channel is down: that Broadcast and every later one return the same
// error, wrapping ErrDown and the cause. The other ranks are not told:
// they wait until their own ctx is done.
//
// The channel owns its communicator, which must serve it alone: the
// Engine broadcasts from its worker at moments unrelated to the host's
// own collectives, and NCCL needs every rank to issue a communicator's
// collectives in the same order; an abort would also take the host's
// communicator down with the channel.
type Channel struct {
	comm        *Comm
	mem         Memory
	rank, ranks int
	stream      device.Stream
	ev          device.Event

	hdrDev  device.DevPtr
	hdrHost device.HostBuf
	dataDev device.DevPtr // capacity dataCap
	data    device.HostBuf
	dataCap int64

	// mu serializes Broadcast and Close.
	mu       sync.Mutex
	down     error
	released bool
	quit     chan struct{}
	once     sync.Once
}

// NewChannel makes a Channel over comm, which it owns from now on (Close
// destroys it; a failed Broadcast aborts it), on the device of mem. Every
// rank calls it: it makes a first exchange, which also sets up NCCL's
// connections (NCCL 2.22 and later connect lazily, inside the first
// collective, which can then hold the host thread until the peers join),
// and returns when every rank took part or ctx is done. On failure comm is
// aborted.
func NewChannel(ctx context.Context, comm *Comm, mem Memory) (*Channel, error) {
	if comm == nil || mem == nil {
		return nil, fmt.Errorf("nccl: new channel: nil communicator or memory: %w", device.ErrInvalidValue)
	}
	c := &Channel{comm: comm, mem: mem, rank: comm.Rank(), ranks: comm.Count(), quit: make(chan struct{})}
	err := c.setup()
	if err == nil {
		var v int64
		if v, err = c.header(ctx, headerMagic); err == nil && v != headerMagic {
			err = fmt.Errorf("nccl: channel rank %d: first exchange got %#x, want %#x: peers out of step", c.rank, v, int64(headerMagic))
		}
	}
	if err != nil {
		err = errors.Join(err, comm.Abort(), c.release())
		return nil, err
	}
	return c, nil
}

// setup makes the stream, the event and the length buffers.
func (c *Channel) setup() error {
	var err error
	if c.stream, err = c.mem.NewStream(); err != nil {
		return err
	}
	if c.ev, err = c.mem.NewEvent(); err != nil {
		return err
	}
	if c.hdrDev, err = c.mem.Alloc(8); err != nil {
		return err
	}
	c.hdrHost, err = c.mem.AllocHost(8)
	return err
}

// Rank is this end's rank.
func (c *Channel) Rank() int { return c.rank }

// Ranks is the number of ranks.
func (c *Channel) Ranks() int { return c.ranks }

// Broadcast implements the root package's PolicyChannel: rank 0 sends
// payload and returns it; every other rank passes nil and returns rank 0's
// payload (nil for a nil one, empty for an empty one). Calls are
// serialized; see Channel for blocking, ctx and failures.
func (c *Channel) Broadcast(ctx context.Context, payload []byte) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.down != nil {
		return nil, c.down
	}
	out, err := c.exchange(ctx, payload)
	if err != nil {
		return nil, c.fail(err)
	}
	return out, nil
}

// fail takes the channel down for cause: the communicator is aborted.
func (c *Channel) fail(cause error) error {
	if aerr := c.comm.Abort(); aerr != nil {
		cause = fmt.Errorf("%w (abort: %v)", cause, aerr)
	}
	c.down = fmt.Errorf("%w (rank %d of %d): %w", ErrDown, c.rank, c.ranks, cause)
	return c.down
}

func (c *Channel) exchange(ctx context.Context, payload []byte) ([]byte, error) {
	if c.rank == 0 {
		n := int64(len(payload))
		if n > MaxPayload {
			return nil, fmt.Errorf("broadcast of %d bytes, more than %d: %w", n, MaxPayload, device.ErrInvalidValue)
		}
		hdr := n
		if payload == nil {
			hdr = -1
		}
		if err := c.grow(n); err != nil {
			return nil, err
		}
		binary.LittleEndian.PutUint64(c.hdrHost.Bytes(), uint64(hdr))
		if err := c.mem.CopyH2D(c.hdrDev, c.hdrHost, c.stream); err != nil {
			return nil, err
		}
		if err := c.comm.Broadcast(c.hdrDev, c.hdrDev, 8, Uint8, 0, c.stream); err != nil {
			return nil, err
		}
		if n > 0 {
			copy(c.data.Bytes(), payload)
			if err := c.mem.CopyH2D(c.dataDev, c.data.Slice(0, n), c.stream); err != nil {
				return nil, err
			}
			if err := c.comm.Broadcast(c.dataDev, c.dataDev, n, Uint8, 0, c.stream); err != nil {
				return nil, err
			}
		}
		if err := c.wait(ctx); err != nil {
			return nil, err
		}
		return payload, nil
	}
	n, err := c.header(ctx, 0)
	switch {
	case err != nil:
		return nil, err
	case n < -1 || n > MaxPayload:
		return nil, fmt.Errorf("rank 0 announced %d bytes: peers out of step", n)
	case n == -1:
		return nil, nil
	case n == 0:
		return []byte{}, nil
	}
	if err := c.grow(n); err != nil {
		return nil, err
	}
	if err := c.comm.Broadcast(c.dataDev, c.dataDev, n, Uint8, 0, c.stream); err != nil {
		return nil, err
	}
	if err := c.mem.CopyD2H(c.data.Slice(0, n), c.dataDev, c.stream); err != nil {
		return nil, err
	}
	if err := c.wait(ctx); err != nil {
		return nil, err
	}
	return bytes.Clone(c.data.Bytes()[:n]), nil
}

// header broadcasts v from rank 0 and returns what arrived (v on rank 0).
func (c *Channel) header(ctx context.Context, v int64) (int64, error) {
	if c.rank == 0 {
		binary.LittleEndian.PutUint64(c.hdrHost.Bytes(), uint64(v))
		if err := c.mem.CopyH2D(c.hdrDev, c.hdrHost, c.stream); err != nil {
			return 0, err
		}
	}
	if err := c.comm.Broadcast(c.hdrDev, c.hdrDev, 8, Uint8, 0, c.stream); err != nil {
		return 0, err
	}
	if c.rank != 0 {
		if err := c.mem.CopyD2H(c.hdrHost, c.hdrDev, c.stream); err != nil {
			return 0, err
		}
	}
	if err := c.wait(ctx); err != nil {
		return 0, err
	}
	return int64(binary.LittleEndian.Uint64(c.hdrHost.Bytes())), nil
}

// grow makes the data buffers hold n bytes. The stream is idle: every
// exchange waits for its work before returning.
func (c *Channel) grow(n int64) error {
	if n <= c.dataCap {
		return nil
	}
	size := max(int64(minData), int64(1)<<bits.Len64(uint64(n-1)))
	if err := c.freeData(); err != nil {
		return err
	}
	p, err := c.mem.Alloc(size)
	if err != nil {
		return err
	}
	h, err := c.mem.AllocHost(size)
	if err != nil {
		return errors.Join(err, c.mem.Free(p))
	}
	c.dataDev, c.data, c.dataCap = p, h, size
	return nil
}

func (c *Channel) freeData() error {
	var errs []error
	if c.dataDev != 0 {
		errs = append(errs, c.mem.Free(c.dataDev))
	}
	if c.data.Len() > 0 {
		errs = append(errs, c.mem.FreeHost(c.data))
	}
	c.dataDev, c.data, c.dataCap = 0, device.HostBuf{}, 0
	return errors.Join(errs...)
}

// wait records the event after the work queued so far and polls it until
// it completes, the communicator reports an error, ctx is done or the
// channel is closed.
func (c *Channel) wait(ctx context.Context) error {
	if err := c.mem.Record(c.ev, c.stream); err != nil {
		return err
	}
	delay := pollFirst
	var t *time.Timer
	for {
		done, err := c.mem.Query(c.ev)
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		if err := c.comm.AsyncError(); err != nil {
			return err
		}
		if t == nil {
			t = time.NewTimer(delay)
			defer t.Stop()
		} else {
			t.Reset(delay)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("broadcast: %w", context.Cause(ctx))
		case <-c.quit:
			return ErrClosed
		case <-t.C:
		}
		delay = min(2*delay, pollLast)
	}
}

// Close closes this rank's end: a Broadcast under way returns an error
// wrapping ErrClosed (its communicator aborted), later ones return it too,
// and the channel's stream, event and buffers are freed and its
// communicator destroyed (unless already aborted). The other ranks are not
// told: a host closes every rank's end. Close is idempotent.
func (c *Channel) Close() error {
	c.once.Do(func() { close(c.quit) })
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released {
		return nil
	}
	if c.down == nil {
		c.down = fmt.Errorf("%w (rank %d of %d): %w", ErrDown, c.rank, c.ranks, ErrClosed)
	}
	return errors.Join(c.release(), c.comm.Destroy())
}

// release frees what setup and grow made.
func (c *Channel) release() error {
	c.released = true
	errs := []error{c.freeData()}
	if c.hdrHost.Len() > 0 {
		errs = append(errs, c.mem.FreeHost(c.hdrHost))
		c.hdrHost = device.HostBuf{}
	}
	if c.hdrDev != 0 {
		errs = append(errs, c.mem.Free(c.hdrDev))
		c.hdrDev = 0
	}
	if c.ev != 0 {
		errs = append(errs, c.mem.DestroyEvent(c.ev))
		c.ev = 0
	}
	if c.stream != 0 {
		errs = append(errs, c.mem.DestroyStream(c.stream))
		c.stream = 0
	}
	return errors.Join(errs...)
}
