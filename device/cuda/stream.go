package cuda

import (
	"fmt"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/internal/dl"
)

// cudaStreamNonBlocking: the stream does not synchronize with the legacy
// default stream, so swap copies never serialize behind compute implicitly.
const streamNonBlocking = 0x01

type streamFuncs struct {
	// cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags);
	cudaStreamCreateWithFlags func(pStream *uintptr, flags uint32) int32
	// cudaError_t cudaStreamDestroy(cudaStream_t stream);
	cudaStreamDestroy func(stream uintptr) int32
	// cudaError_t cudaStreamSynchronize(cudaStream_t stream);
	cudaStreamSynchronize func(stream uintptr) int32
	// cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
	cudaStreamWaitEvent func(stream, event uintptr, flags uint32) int32
}

func (f *streamFuncs) load(l *dl.Library) error {
	err := l.Bind(
		dl.Func{Ptr: &f.cudaStreamCreateWithFlags, Name: "cudaStreamCreateWithFlags"},
		dl.Func{Ptr: &f.cudaStreamDestroy, Name: "cudaStreamDestroy"},
		dl.Func{Ptr: &f.cudaStreamSynchronize, Name: "cudaStreamSynchronize"},
		dl.Func{Ptr: &f.cudaStreamWaitEvent, Name: "cudaStreamWaitEvent"},
	)
	if err != nil {
		return err
	}
	wait, err := l.Sym("cudaStreamWaitEvent")
	if err != nil {
		return err
	}
	f.cudaStreamWaitEvent = func(stream, event uintptr, flags uint32) int32 {
		return fastCall(wait, stream, event, uintptr(flags))
	}
	return nil
}

// DefaultStream implements device.Device: the stream given with WithStream,
// else the legacy default stream (0).
func (d *Device) DefaultStream() device.Stream { return d.compute }

// NewStream implements device.Device with a non-blocking stream.
func (d *Device) NewStream() (device.Stream, error) {
	if err := d.enter("new stream"); err != nil {
		return 0, err
	}
	defer d.leave()
	return d.streams.Create(func(s *uintptr) error {
		return check("cudaStreamCreateWithFlags", d.api.cudaStreamCreateWithFlags(s, streamNonBlocking))
	}, struct{}{})
}

// DestroyStream implements device.Device. Only streams from NewStream can be
// destroyed; the default stream belongs to whoever made it.
func (d *Device) DestroyStream(s device.Stream) error {
	if err := d.enter("destroy stream"); err != nil {
		return err
	}
	defer d.leave()
	return d.streams.Destroy(s, d.api.destroyStream)
}

func (f *streamFuncs) destroyStream(s uintptr) error {
	return check("cudaStreamDestroy", f.cudaStreamDestroy(s))
}

// SyncStream implements device.Device with cudaStreamSynchronize.
func (d *Device) SyncStream(s device.Stream) error {
	if err := d.enter("sync stream"); err != nil {
		return err
	}
	defer d.leave()
	if rc := d.api.cudaStreamSynchronize(uintptr(s)); rc != 0 {
		return fmt.Errorf("cuda: sync stream %#x: %w", uintptr(s), fail("cudaStreamSynchronize", rc))
	}
	return nil
}

// StreamWait implements device.Device with cudaStreamWaitEvent.
func (d *Device) StreamWait(s device.Stream, ev device.Event) error {
	if err := d.enter("stream wait"); err != nil {
		return err
	}
	defer d.leave()
	if rc := d.api.cudaStreamWaitEvent(uintptr(s), uintptr(ev), 0); rc != 0 {
		return fmt.Errorf("cuda: stream %#x wait event %#x: %w", uintptr(s), uintptr(ev), fail("cudaStreamWaitEvent", rc))
	}
	return nil
}
