// Package device is the I/O boundary of chameleon: the Device interface that
// the execution engine drives, and the memory managers a swap path needs on
// top of it (a caching, stream-aware device allocator and a pinned host pool).
//
// Backends live in subpackages: device/host (pure Go, for tests and GPU-less
// hosts), device/cuda (libcudart through purego) and device/ascend
// (libascendcl through purego). All of them follow CUDA's stream and event
// semantics, which is the contract the engine is written against:
//
//   - work queued on one stream runs in FIFO order;
//   - Record captures the work queued on the stream so far; Query and
//     SyncEvent refer to the most recent Record, and an event that was never
//     recorded counts as complete;
//   - StreamWait makes work queued later on a stream wait for the event's
//     captured work on the device's timeline; the caller is not blocked.
package device

import (
	"errors"
	"time"
	"unsafe"
)

// Sentinel errors shared by every backend. Backends wrap their native error
// codes so that callers branch with errors.Is without knowing the backend.
var (
	// ErrOutOfMemory reports that a device or pinned host allocation did not fit.
	ErrOutOfMemory = errors.New("device: out of memory")
	// ErrLibraryNotFound reports that the vendor runtime library could not be loaded.
	ErrLibraryNotFound = errors.New("device: runtime library not found")
	// ErrInvalidValue reports a bad argument: unknown handle, size or range.
	ErrInvalidValue = errors.New("device: invalid value")
	// ErrClosed reports use of a Device (or allocator) after Close.
	ErrClosed = errors.New("device: closed")
	// ErrNotSupported reports a capability the device lacks, such as
	// mapping pages (Mapper).
	ErrNotSupported = errors.New("device: not supported")
	// ErrNotReady reports that an event's captured work has not completed
	// yet, so its time is not known (Elapsed).
	ErrNotReady = errors.New("device: not ready")
)

// DevPtr is a device address. Offsets inside one allocation are plain
// additions (p + DevPtr(off)), as with CUDA device pointers. Zero is never a
// valid allocation.
type DevPtr uintptr

// Add returns p advanced by off bytes.
func (p DevPtr) Add(off int64) DevPtr { return p + DevPtr(off) }

// Stream is a backend handle for an in-order queue of device work. Handles are
// plain values so that the hot path passes them without allocating; on CUDA
// and Ascend they are the native cudaStream_t / aclrtStream.
type Stream uintptr

// Event is a backend handle for a marker recorded on a stream.
type Event uintptr

// HostBuf is a span of host memory that copies read from or write to
// asynchronously. On GPU backends it is page-locked memory from AllocHost:
// only pinned memory reaches full link bandwidth and is safe to hand to an
// asynchronous copy. Sub-spans made with Slice may be used in copies; only the
// buffer returned by AllocHost may be passed to FreeHost.
type HostBuf struct {
	b []byte
}

// WrapHost makes a HostBuf over b. It exists for backends, which wrap the
// memory they allocated; callers get HostBufs from Device.AllocHost or
// HostPool.Get.
func WrapHost(b []byte) HostBuf { return HostBuf{b: b} }

// Bytes returns the buffer's memory. Reading or writing it while a copy that
// uses it is pending is a data race, as on the device.
func (h HostBuf) Bytes() []byte { return h.b }

// Len returns the buffer's size in bytes.
func (h HostBuf) Len() int64 { return int64(len(h.b)) }

// Ptr returns the address of the first byte, or nil for an empty buffer.
func (h HostBuf) Ptr() unsafe.Pointer {
	if len(h.b) == 0 {
		return nil
	}
	return unsafe.Pointer(unsafe.SliceData(h.b))
}

// Slice returns the n bytes starting at off. It panics when the range is out
// of bounds, like slicing.
func (h HostBuf) Slice(off, n int64) HostBuf { return HostBuf{b: h.b[off : off+n : off+n]} }

// Device is an accelerator as the execution engine sees it: device memory,
// pinned host memory, streams, asynchronous copies and events. Every method is
// safe for concurrent use. Methods of a closed Device return ErrClosed.
type Device interface {
	// Name describes the device, e.g. "NVIDIA H200 (cuda:0)".
	Name() string

	// Alloc reserves size bytes of device memory. It fails with an error
	// wrapping ErrOutOfMemory when the device cannot hold them.
	Alloc(size int64) (DevPtr, error)
	// Free releases memory from Alloc. Backends may block until pending work
	// finishes (cudaFree does), which is why a swap path frees through an
	// Allocator instead.
	Free(p DevPtr) error

	// AllocHost reserves size bytes of page-locked host memory. It is slow on
	// real hardware (tens of milliseconds per 64 MiB): pool it.
	AllocHost(size int64) (HostBuf, error)
	// FreeHost releases a buffer returned by AllocHost.
	FreeHost(b HostBuf) error

	// DefaultStream returns the stream the host's compute runs on: the one
	// configured when the device was opened, or the backend's default stream.
	DefaultStream() Stream
	// NewStream creates a stream that does not synchronize implicitly with
	// the default stream; ordering between streams is by events only.
	NewStream() (Stream, error)
	// DestroyStream releases a stream. Work already queued on it still runs.
	DestroyStream(s Stream) error

	// CopyH2D queues a copy of src.Len() bytes from host to device on s.
	CopyH2D(dst DevPtr, src HostBuf, s Stream) error
	// CopyD2H queues a copy of dst.Len() bytes from device to host on s.
	CopyD2H(dst HostBuf, src DevPtr, s Stream) error
	// CopyD2D queues a copy of n bytes between device addresses on s.
	CopyD2D(dst, src DevPtr, n int64, s Stream) error

	// NewEvent creates an event without timing (cheaper to record).
	NewEvent() (Event, error)
	// Record captures the work queued on s so far into ev.
	Record(ev Event, s Stream) error
	// StreamWait makes work queued later on s wait until ev's captured work
	// completes. It does not block the caller.
	StreamWait(s Stream, ev Event) error
	// Query reports whether ev's captured work has completed. An event that
	// was never recorded is complete.
	Query(ev Event) (done bool, err error)
	// SyncEvent blocks the caller until ev's captured work completes.
	SyncEvent(ev Event) error
	// SyncStream blocks the caller until all work queued on s completes.
	SyncStream(s Stream) error
	// DestroyEvent releases an event.
	DestroyEvent(ev Event) error

	// NewTimingEvent creates an event that also records when its captured
	// work completed on the device's timeline, for Elapsed. Recording it
	// costs more than an event from NewEvent; it orders work the same way.
	NewTimingEvent() (Event, error)
	// Elapsed is the device time from start's captured work completing to
	// end's (negative when end completed first). Both must be timing
	// events, recorded (else an error wrapping ErrInvalidValue) and
	// complete (else ErrNotReady); they may be on different streams of the
	// device. CUDA and Ascend resolve about half a microsecond.
	Elapsed(start, end Event) (time.Duration, error)

	// MemInfo reports free and total device memory in bytes.
	MemInfo() (free, total int64, err error)

	// ReadDevice copies len(dst) bytes from src into dst after all queued work
	// on the device has completed. It is slow and meant for tests and
	// checks, so that byte identity can be verified on every backend.
	ReadDevice(dst []byte, src DevPtr) error
	// WriteDevice copies src to dst after all queued work on the device has
	// completed, then returns.
	WriteDevice(dst DevPtr, src []byte) error

	// Close releases the device's streams and handles. Memory still allocated
	// is not freed automatically on every backend.
	Close() error
}
