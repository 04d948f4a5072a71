// Package nccl binds the parts of NCCL (libnccl) that a chameleon host
// needs, through purego without cgo, and carries the policies of
// data-parallel ranks over it: Channel is a chameleon.PolicyChannel whose
// broadcast from rank 0 is an ncclBroadcast between the ranks' GPUs.
//
// # Finding the library
//
// Open looks for libnccl in this order: WithLibrary's path, the
// CHAMELEON_NCCL environment variable, then libnccl.so.2 and libnccl.so on
// the loader path, then the same names in the directory of
// CHAMELEON_CUDART (device/cuda's libcudart, which libnccl often sits
// next to) and in Dirs (/usr/local/cuda/lib64, the CUDA toolkit's target
// directory, /usr/local/nccl/lib and the distribution's multiarch
// directory, where the libnccl2 package puts it). The first that loads
// wins. When none does, the error wraps ErrLibrary and
// device.ErrLibraryNotFound and names every place tried with the
// loader's reason; a library that lacks a symbol this package needs is an
// error wrapping ErrLibrary that names the symbol. Every call returns an
// *Error on failure: the call, its ncclResult_t (Result, which errors.Is
// matches against ErrInvalidArgument, ErrTimeout and the other
// sentinels), ncclGetErrorString's text and, where the library has it,
// ncclGetLastError's message.
//
// # Communicators and their initialisers
//
// InitAll (ncclCommInitAll) makes the communicators of several GPUs driven
// by one process. InitRank makes one rank's communicator among processes
// that share a UniqueID (ncclGetUniqueId on rank 0, handed out by the
// host). ncclCommInitRank and ncclCommInitRankConfig take the 128-byte
// ncclUniqueId by value; ncclCommInitRankScalable (NCCL 2.23 and later)
// takes it by pointer, and a NULL config, which means NCCL's defaults.
// InitRank calls ncclCommInitRankScalable when the library exports it, so
// that no struct crosses the call by value, and ncclCommInitRank
// otherwise: purego (v0.11) does pass a struct argument by value on Linux
// amd64 (a struct over 16 bytes goes on the stack in eightbytes, the System
// V MEMORY class) and arm64 (a pointer to a copy, as AAPCS64 wants), which
// the tests check byte for byte against a fake library. The pointer-taking
// call comes first so that the common path does not rest on that ABI
// handling. Library.Initialiser names the call in use. ncclCommInitRankConfig offers
// nothing more here (its id is also by value) and is not bound.
//
// Collectives (Comm.Broadcast, Comm.AllReduce) take device addresses as
// device.DevPtr and streams as device.Stream, the plain cudaStream_t
// handles of device/cuda, so this package does not depend on device/cuda.
// NCCL keeps a group (GroupStart, GroupEnd) per OS thread; Library.Group
// holds the goroutine's thread for the group's length. One goroutine that
// drives the communicators of several GPUs issues each collective on all
// of them inside one Group. NCCL sets the communicator's device itself
// for a collective; InitRank makes the communicator on the device current
// on the calling thread, which a DeviceContext (device/cuda's
// Device.Context) sets.
//
// Comm.AsyncError reports a failure met in queued work (ncclRemoteError
// for a peer gone, ncclTimeout); Comm.Abort (ncclCommAbort) is the way out
// of a collective a peer never joins. Neither tells the other ranks.
//
// # Channel
//
// NewChannel makes one rank's end of a policy channel over a communicator
// of its own, with the device's memory, streams and events behind the
// Memory interface, which every device.Device (so *cuda.Device) has. A
// Broadcast is two ncclBroadcasts from rank 0 on the channel's stream: the
// payload's length (an int64; -1 for nil), then its bytes, staged through
// pinned host memory and a device buffer that grow to the largest payload
// (a power of two, from 64 KiB, up to MaxPayload). Rank 0's payload comes
// back on every rank byte for byte, nil as nil and empty as empty.
//
// Broadcast blocks the calling goroutine until this rank's part is done,
// polling an event on the stream (20 us doubling to 2 ms, with
// ncclCommGetAsyncError at each poll) rather than blocking in the driver,
// so it returns as soon as ctx is done or the channel is closed. The Engine
// calls it from its planning worker, with WithRankTimeout's deadline, never
// from End. Calls are serialized.
//
// Limits:
//   - The communicator must serve the channel alone. The Engine broadcasts
//     at moments unrelated to the host's own collectives, and NCCL needs
//     every rank to issue a communicator's collectives in the same order;
//     a second InitAll or InitRank (with its own UniqueID) makes one.
//   - A failed Broadcast (ctx done, Close, an NCCL or device error) aborts
//     the communicator and leaves the channel down: every later Broadcast
//     returns the same error, wrapping ErrDown and the cause. This matches
//     the Engine, which plans on its own after a failed exchange and never
//     exchanges again. The other ranks are not told: each waits for its
//     own ctx, so a host that knows of a failure closes every rank's end.
//   - NewChannel makes a first exchange on every rank, so every rank calls
//     it, concurrently. NCCL 2.22 and later connect peers lazily, inside
//     the first collective that needs them (NCCL_RUNTIME_CONNECT), which
//     can then hold the host thread until the peers join; doing it in
//     NewChannel keeps that out of the Engine's broadcasts.
//     NCCL's initialisers (InitAll, InitRank) and that first connection
//     block in the library and cannot be interrupted by ctx.
//   - A Broadcast that gets a length above MaxPayload or below -1 takes
//     the peers for out of step and fails.
//
// Close frees the channel's stream, event and buffers and destroys its
// communicator (unless a failure aborted it).
package nccl
