package ascend

import (
	"fmt"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/internal/dl"
)

type streamFuncs struct {
	// aclError aclrtCreateStream(aclrtStream *stream);
	aclrtCreateStream func(stream *uintptr) int32
	// aclError aclrtDestroyStream(aclrtStream stream);
	aclrtDestroyStream func(stream uintptr) int32
	// aclError aclrtSynchronizeStream(aclrtStream stream);
	aclrtSynchronizeStream func(stream uintptr) int32
	// aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event);
	aclrtStreamWaitEvent func(stream, event uintptr) int32
}

func (f *streamFuncs) load(l *dl.Library) error {
	err := l.Bind(
		dl.Func{Ptr: &f.aclrtCreateStream, Name: "aclrtCreateStream"},
		dl.Func{Ptr: &f.aclrtDestroyStream, Name: "aclrtDestroyStream"},
		dl.Func{Ptr: &f.aclrtSynchronizeStream, Name: "aclrtSynchronizeStream"},
		dl.Func{Ptr: &f.aclrtStreamWaitEvent, Name: "aclrtStreamWaitEvent"},
	)
	if err != nil {
		return err
	}
	wait, err := l.Sym("aclrtStreamWaitEvent")
	if err != nil {
		return err
	}
	f.aclrtStreamWaitEvent = func(stream, event uintptr) int32 { return fastCall(wait, stream, event) }
	return nil
}

// DefaultStream implements device.Device: the stream given with WithStream,
// else the default stream (NULL).
func (d *Device) DefaultStream() device.Stream { return d.compute }

// NewStream implements device.Device with aclrtCreateStream.
func (d *Device) NewStream() (device.Stream, error) {
	if err := d.enter("new stream"); err != nil {
		return 0, err
	}
	defer d.leave()
	return d.streams.Create(func(s *uintptr) error {
		return check("aclrtCreateStream", d.api.aclrtCreateStream(s))
	}, struct{}{})
}

// DestroyStream implements device.Device for streams from NewStream.
func (d *Device) DestroyStream(s device.Stream) error {
	if err := d.enter("destroy stream"); err != nil {
		return err
	}
	defer d.leave()
	return d.streams.Destroy(s, d.api.destroyStream)
}

func (f *streamFuncs) destroyStream(s uintptr) error {
	return check("aclrtDestroyStream", f.aclrtDestroyStream(s))
}

// SyncStream implements device.Device with aclrtSynchronizeStream.
func (d *Device) SyncStream(s device.Stream) error {
	if err := d.enter("sync stream"); err != nil {
		return err
	}
	defer d.leave()
	if rc := d.api.aclrtSynchronizeStream(uintptr(s)); rc != 0 {
		return fmt.Errorf("ascend: sync stream %#x: %w", uintptr(s), fail("aclrtSynchronizeStream", rc))
	}
	return nil
}

// StreamWait implements device.Device with aclrtStreamWaitEvent. An event
// that was never recorded is skipped: on AscendCL it would never complete,
// while the device contract counts it as complete.
func (d *Device) StreamWait(s device.Stream, ev device.Event) error {
	if err := d.enter("stream wait"); err != nil {
		return err
	}
	defer d.leave()
	if !d.recorded(ev) {
		return nil
	}
	if rc := d.api.aclrtStreamWaitEvent(uintptr(s), uintptr(ev)); rc != 0 {
		return fmt.Errorf("ascend: stream %#x wait event %#x: %w", uintptr(s), uintptr(ev), fail("aclrtStreamWaitEvent", rc))
	}
	return nil
}
