package cuda

import (
	"fmt"
	"time"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/internal/dl"
)

// cudaEventDisableTiming: swap events only order work; timing makes
// recording more expensive.
const eventDisableTiming = 0x02

type eventFuncs struct {
	// cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
	cudaEventCreateWithFlags func(event *uintptr, flags uint32) int32
	// cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
	cudaEventRecord func(event, stream uintptr) int32
	// cudaError_t cudaEventQuery(cudaEvent_t event);
	cudaEventQuery func(event uintptr) int32
	// cudaError_t cudaEventSynchronize(cudaEvent_t event);
	cudaEventSynchronize func(event uintptr) int32
	// cudaError_t cudaEventDestroy(cudaEvent_t event);
	cudaEventDestroy func(event uintptr) int32
	// cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
	cudaEventElapsedTime func(ms *float32, start, end uintptr) int32
}

func (f *eventFuncs) load(l *dl.Library) error {
	err := l.Bind(
		dl.Func{Ptr: &f.cudaEventCreateWithFlags, Name: "cudaEventCreateWithFlags"},
		dl.Func{Ptr: &f.cudaEventRecord, Name: "cudaEventRecord"},
		dl.Func{Ptr: &f.cudaEventQuery, Name: "cudaEventQuery"},
		dl.Func{Ptr: &f.cudaEventSynchronize, Name: "cudaEventSynchronize"},
		dl.Func{Ptr: &f.cudaEventDestroy, Name: "cudaEventDestroy"},
		dl.Func{Ptr: &f.cudaEventElapsedTime, Name: "cudaEventElapsedTime"},
	)
	if err != nil {
		return err
	}
	record, err := l.Sym("cudaEventRecord")
	if err != nil {
		return err
	}
	query, err := l.Sym("cudaEventQuery")
	if err != nil {
		return err
	}
	f.cudaEventRecord = func(event, stream uintptr) int32 { return fastCall(record, event, stream) }
	f.cudaEventQuery = func(event uintptr) int32 { return fastCall(query, event) }
	return nil
}

// NewEvent implements device.Device with cudaEventDisableTiming.
func (d *Device) NewEvent() (device.Event, error) {
	if err := d.enter("new event"); err != nil {
		return 0, err
	}
	defer d.leave()
	return d.events.Create(func(e *uintptr) error {
		return check("cudaEventCreateWithFlags", d.api.cudaEventCreateWithFlags(e, eventDisableTiming))
	}, struct{}{})
}

// NewTimingEvent implements device.Device with cudaEventCreateWithFlags
// (cudaEventDefault: timing on).
func (d *Device) NewTimingEvent() (device.Event, error) {
	if err := d.enter("new timing event"); err != nil {
		return 0, err
	}
	defer d.leave()
	return d.events.Create(func(e *uintptr) error {
		return check("cudaEventCreateWithFlags", d.api.cudaEventCreateWithFlags(e, 0))
	}, struct{}{})
}

// Elapsed implements device.Device with cudaEventElapsedTime, whose
// cudaErrorNotReady is device.ErrNotReady; an event without timing or never
// recorded is cudaErrorInvalidResourceHandle, device.ErrInvalidValue.
func (d *Device) Elapsed(start, end device.Event) (time.Duration, error) {
	if err := d.enter("elapsed"); err != nil {
		return 0, err
	}
	defer d.leave()
	var ms float32
	switch rc := d.api.cudaEventElapsedTime(&ms, uintptr(start), uintptr(end)); Error(rc) {
	case 0:
		return time.Duration(float64(ms) * float64(time.Millisecond)), nil
	case ErrorNotReady:
		return 0, fmt.Errorf("cuda: elapsed from event %#x to %#x: %w", uintptr(start), uintptr(end), device.ErrNotReady)
	default:
		return 0, fmt.Errorf("cuda: elapsed from event %#x to %#x: %w", uintptr(start), uintptr(end), fail("cudaEventElapsedTime", rc))
	}
}

// DestroyEvent implements device.Device.
func (d *Device) DestroyEvent(ev device.Event) error {
	if err := d.enter("destroy event"); err != nil {
		return err
	}
	defer d.leave()
	return d.events.Destroy(ev, d.api.destroyEvent)
}

func (f *eventFuncs) destroyEvent(e uintptr) error {
	return check("cudaEventDestroy", f.cudaEventDestroy(e))
}

// Record implements device.Device with cudaEventRecord.
func (d *Device) Record(ev device.Event, s device.Stream) error {
	if err := d.enter("record"); err != nil {
		return err
	}
	defer d.leave()
	if rc := d.api.cudaEventRecord(uintptr(ev), uintptr(s)); rc != 0 {
		return fmt.Errorf("cuda: record event %#x on stream %#x: %w", uintptr(ev), uintptr(s), fail("cudaEventRecord", rc))
	}
	return nil
}

// Query implements device.Device with cudaEventQuery; cudaErrorNotReady is
// the "not done" answer, not an error.
func (d *Device) Query(ev device.Event) (bool, error) {
	if err := d.enter("query"); err != nil {
		return false, err
	}
	defer d.leave()
	switch rc := d.api.cudaEventQuery(uintptr(ev)); Error(rc) {
	case 0:
		return true, nil
	case ErrorNotReady:
		return false, nil
	default:
		return false, fmt.Errorf("cuda: query event %#x: %w", uintptr(ev), fail("cudaEventQuery", rc))
	}
}

// SyncEvent implements device.Device with cudaEventSynchronize.
func (d *Device) SyncEvent(ev device.Event) error {
	if err := d.enter("sync event"); err != nil {
		return err
	}
	defer d.leave()
	if rc := d.api.cudaEventSynchronize(uintptr(ev)); rc != 0 {
		return fmt.Errorf("cuda: sync event %#x: %w", uintptr(ev), fail("cudaEventSynchronize", rc))
	}
	return nil
}
