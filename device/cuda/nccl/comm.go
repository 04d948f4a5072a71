package nccl

import (
	"errors"
	"fmt"
	"runtime"
	"sync"

	"github.com/chameleon-go/chameleon/device"
)

// UniqueIDBytes is NCCL_UNIQUE_ID_BYTES.
const UniqueIDBytes = 128

// UniqueID is an ncclUniqueId: rank 0 makes one (Library.UniqueID) and the
// host hands it to every rank out of band (its launcher, a file, a socket)
// before they call InitRank with it.
type UniqueID [UniqueIDBytes]byte

// UniqueID makes a new id (ncclGetUniqueId), on the rank that then
// distributes it.
func (l *Library) UniqueID() (UniqueID, error) {
	var id UniqueID
	if err := l.check("ncclGetUniqueId", l.getUniqueID(&id), 0); err != nil {
		return UniqueID{}, err
	}
	return id, nil
}

// DataType is an ncclDataType_t.
type DataType int32

// ncclDataType_t values (nccl.h).
const (
	Int8       DataType = 0
	Uint8      DataType = 1
	Int32      DataType = 2
	Uint32     DataType = 3
	Int64      DataType = 4
	Uint64     DataType = 5
	Float16    DataType = 6
	Float32    DataType = 7
	Float64    DataType = 8
	Bfloat16   DataType = 9  // NCCL 2.10 and later
	Float8e4m3 DataType = 10 // NCCL 2.24 and later, on sm_90
	Float8e5m2 DataType = 11
)

// Size is the element's size in bytes (0 for an unknown type).
func (d DataType) Size() int64 {
	switch d {
	case Int8, Uint8, Float8e4m3, Float8e5m2:
		return 1
	case Float16, Bfloat16:
		return 2
	case Int32, Uint32, Float32:
		return 4
	case Int64, Uint64, Float64:
		return 8
	}
	return 0
}

// RedOp is an ncclRedOp_t of the built-in reductions.
type RedOp int32

// ncclRedOp_t values (nccl.h).
const (
	Sum  RedOp = 0
	Prod RedOp = 1
	Max  RedOp = 2
	Min  RedOp = 3
	Avg  RedOp = 4 // NCCL 2.10 and later
)

// Comm is one rank's communicator (ncclComm_t). Its methods are safe for
// concurrent use, but NCCL wants the collectives of one communicator
// issued in the same order on every rank, so a host issues them from one
// goroutine per rank. After Destroy or Abort every call fails with
// ErrCommClosed, and Destroy and Abort do nothing.
type Comm struct {
	lib *Library
	// mu is held for reading during each call with the handle, for
	// writing by Destroy and Abort, which free it.
	mu                  sync.RWMutex
	h                   uintptr
	rank, count, device int
}

// DeviceContext makes a device current on the calling goroutine's locked
// OS thread between Enter and Leave. *driver.Context (device/cuda's
// Device.Context) is one.
type DeviceContext interface {
	Enter() error
	Leave()
}

// InitAll creates one communicator per device of this process
// (ncclCommInitAll): rank i runs on devices[i]. A single goroutine may
// then drive them all, issuing each collective on every communicator
// inside one Group; or one goroutine per rank may each drive its own.
func (l *Library) InitAll(devices ...int) ([]*Comm, error) {
	if len(devices) == 0 {
		return nil, fmt.Errorf("nccl: init all: no devices: %w", device.ErrInvalidValue)
	}
	devs := make([]int32, len(devices))
	for i, d := range devices {
		devs[i] = int32(d)
	}
	hs := make([]uintptr, len(devices))
	if err := l.check("ncclCommInitAll", l.commInitAll(&hs[0], int32(len(devs)), &devs[0]), 0); err != nil {
		return nil, err
	}
	comms := make([]*Comm, len(hs))
	for i, h := range hs {
		c, err := l.newComm(h)
		if err != nil {
			for _, h := range hs[i+1:] {
				l.commDestroy(h)
			}
			for _, c := range comms[:i] {
				c.Destroy()
			}
			return nil, err
		}
		comms[i] = c
	}
	return comms, nil
}

// InitRank creates this process's communicator of rank rank among nranks
// ranks, all of which call it with the same id; it returns when all have
// joined. The communicator runs on the device current on the calling
// thread: dev's, when dev is not nil (it is entered around the call),
// else the thread's (device 0 unless the host set another).
//
// It calls ncclCommInitRankScalable (NCCL 2.23 and later), which takes the
// id by pointer, when the library has it, else ncclCommInitRank, which
// takes the 128-byte id by value (Initialiser says which).
func (l *Library) InitRank(nranks int, id UniqueID, rank int, dev DeviceContext) (*Comm, error) {
	return l.initRank(nranks, id, rank, dev, l.commInitRankScalable == nil)
}

// initRank is InitRank; byValue calls ncclCommInitRank even when the
// library has ncclCommInitRankScalable.
func (l *Library) initRank(nranks int, id UniqueID, rank int, dev DeviceContext, byValue bool) (*Comm, error) {
	if nranks < 1 || rank < 0 || rank >= nranks {
		return nil, fmt.Errorf("nccl: init rank %d of %d: %w", rank, nranks, device.ErrInvalidValue)
	}
	if dev != nil {
		if err := dev.Enter(); err != nil {
			return nil, fmt.Errorf("nccl: init rank %d of %d: %w", rank, nranks, err)
		}
		defer dev.Leave()
	} else {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	var h uintptr
	var err error
	switch {
	case !byValue && l.commInitRankScalable != nil:
		ids := id
		err = l.check("ncclCommInitRankScalable", l.commInitRankScalable(&h, int32(nranks), int32(rank), 1, &ids, nil), 0)
		runtime.KeepAlive(&ids)
	case l.commInitRank != nil:
		err = l.check("ncclCommInitRank", l.commInitRank(&h, int32(nranks), uniqueIDArg{Internal: id}, int32(rank)), 0)
	default:
		err = fmt.Errorf("nccl: %w: no initialiser for %s/%s (ncclCommInitRankScalable missing, ncclCommInitRank's by-value id unsupported)",
			ErrLibrary, runtime.GOOS, runtime.GOARCH)
	}
	if err != nil {
		return nil, err
	}
	return l.newComm(h)
}

// newComm wraps h, reading its rank, size and device once. On failure h
// is destroyed.
func (l *Library) newComm(h uintptr) (*Comm, error) {
	var n, d, r int32
	err := errors.Join(
		l.check("ncclCommCount", l.commCount(h, &n), h),
		l.check("ncclCommCuDevice", l.commCuDevice(h, &d), h),
		l.check("ncclCommUserRank", l.commUserRank(h, &r), h),
	)
	if err != nil {
		l.commDestroy(h)
		return nil, err
	}
	return &Comm{lib: l, h: h, rank: int(r), count: int(n), device: int(d)}, nil
}

// Library is the library the communicator belongs to.
func (c *Comm) Library() *Library { return c.lib }

// Handle is the ncclComm_t, for a host that also calls NCCL itself; 0
// after Destroy or Abort.
func (c *Comm) Handle() uintptr {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.h
}

// Rank is this communicator's rank (ncclCommUserRank).
func (c *Comm) Rank() int { return c.rank }

// Count is the number of ranks (ncclCommCount).
func (c *Comm) Count() int { return c.count }

// Device is the CUDA device ordinal the communicator runs on
// (ncclCommCuDevice).
func (c *Comm) Device() int { return c.device }

// do runs one call with the handle held.
func (c *Comm) do(call string, f func(h uintptr) int32) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.h == 0 {
		return fmt.Errorf("nccl: %s: %w", call, ErrCommClosed)
	}
	return c.lib.check(call, f(c.h), c.h)
}

// Broadcast queues on stream s the copy of count elements of type dt from
// root's send buffer to every rank's recv buffer (ncclBroadcast); send
// matters on root only, and send == recv is in place. Like any
// collective it completes once every rank has queued it.
func (c *Comm) Broadcast(send, recv device.DevPtr, count int64, dt DataType, root int, s device.Stream) error {
	if count < 0 || root < 0 || root >= c.count {
		return fmt.Errorf("nccl: broadcast of %d from root %d among %d ranks: %w", count, root, c.count, device.ErrInvalidValue)
	}
	return c.do("ncclBroadcast", func(h uintptr) int32 {
		return c.lib.broadcast(uintptr(send), uintptr(recv), uintptr(count), dt, int32(root), h, uintptr(s))
	})
}

// AllReduce queues on stream s the reduction op of count elements of type
// dt over every rank's send buffer into every rank's recv buffer
// (ncclAllReduce); send == recv is in place.
func (c *Comm) AllReduce(send, recv device.DevPtr, count int64, dt DataType, op RedOp, s device.Stream) error {
	if count < 0 {
		return fmt.Errorf("nccl: all-reduce of %d: %w", count, device.ErrInvalidValue)
	}
	return c.do("ncclAllReduce", func(h uintptr) int32 {
		return c.lib.allReduce(uintptr(send), uintptr(recv), uintptr(count), dt, op, h, uintptr(s))
	})
}

// AsyncError reports an error the communicator met in work already queued
// (ncclCommGetAsyncError): a peer gone, a network failure, a timeout. A
// communicator in error must be aborted. nil while all is well, also for
// ncclInProgress (a non-blocking communicator still busy).
func (c *Comm) AsyncError() error {
	var rc int32
	err := c.do("ncclCommGetAsyncError", func(h uintptr) int32 { return c.lib.commGetAsyncError(h, &rc) })
	if err != nil {
		return err
	}
	if r := Result(rc); r != Success && r != InProgress {
		return &Error{Call: "ncclCommGetAsyncError", Code: r, Text: c.lib.errorString(rc)}
	}
	return nil
}

func (l *Library) errorString(rc int32) string {
	if l.getErrorString == nil {
		return ""
	}
	return l.getErrorString(rc)
}

// Abort stops the communicator's work under way on the device and frees it
// (ncclCommAbort): the way out of a collective that a peer never joins.
// The other ranks' communicators are not told; their collectives hang
// until they abort too.
func (c *Comm) Abort() error { return c.free("ncclCommAbort", c.lib.commAbort) }

// Destroy frees the communicator after its queued work (ncclCommDestroy).
func (c *Comm) Destroy() error { return c.free("ncclCommDestroy", c.lib.commDestroy) }

func (c *Comm) free(call string, f func(uintptr) int32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.h == 0 {
		return nil
	}
	h := c.h
	c.h = 0
	return c.lib.check(call, f(h), 0)
}
